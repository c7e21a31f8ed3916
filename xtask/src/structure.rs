//! `cargo xtask structure`: the shape of the runtime code, read with a
//! real Rust parser (`syn`). Each crate is walked from its root through
//! its `mod` declarations, leaving out what is compiled only for tests
//! (`#[cfg(test)]` modules and `#[test]` functions), so that:
//!
//! - the module graph of each crate is drawn from `crate::`/`super::`
//!   paths, and its cycles (strongly connected sets) are listed;
//! - every function's length is measured from `fn` to its closing brace.
//!
//! The suite holds both to the rules in ARCHITECTURE.md (no cycle, no
//! function over [`MAX_FN_LINES`] unless it is a table) through this
//! module's tests.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};
use syn::{
    Attribute, Block, File, ImplItemFn, Item, ItemFn, ItemMod, ItemUse, Signature, TraitItemFn,
    UseTree,
    visit::{self, Visit},
};

/// The longest a runtime function may be, in lines.
pub const MAX_FN_LINES: usize = 80;

/// Libraries that ship, by root file (relative to the workspace).
const LIBRARIES: &[&str] = &[
    "lb-common/src/lib.rs",
    "lb-ebpf/src/lib.rs",
    "lb-userspace/src/lib.rs",
];

/// Directories of binaries that ship (`name.rs` or `name/main.rs` each).
const BINARIES: &[&str] = &["lb-ebpf/src/bin", "lb-userspace/src/bin"];

/// Binaries that are tools of the project, not runtime code.
const TOOLS: &[&str] = &["lb-bench"];

/// The root files of every crate that ships, relative to `workspace`.
pub fn crate_roots(workspace: &Path) -> Result<Vec<String>> {
    let mut roots: Vec<String> = LIBRARIES.iter().map(ToString::to_string).collect();
    for dir in BINARIES {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(workspace.join(dir)).with_context(|| dir.to_string())? {
            let path = entry?.path();
            let name = path.file_stem().unwrap_or_default().to_string_lossy();
            if TOOLS.contains(&name.as_ref()) {
                continue;
            }
            let root = if path.is_dir() {
                path.join("main.rs")
            } else {
                path.clone()
            };
            if root.extension().is_some_and(|e| e == "rs") && root.exists() {
                let rel = root.strip_prefix(workspace).unwrap_or(&root);
                found.push(rel.display().to_string());
            }
        }
        found.sort();
        roots.extend(found);
    }
    Ok(roots)
}

/// A function of runtime code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// File, relative to the workspace.
    pub file: PathBuf,
    /// `module::path::name` (methods: `Type::name`).
    pub name: String,
    pub line: usize,
    pub lines: usize,
}

/// What one crate's walk found.
#[derive(Debug, Default)]
pub struct CrateShape {
    pub root: PathBuf,
    /// Runtime files and their line counts.
    pub files: Vec<(PathBuf, usize)>,
    pub functions: Vec<Function>,
    /// Top-level module → the top-level modules it names.
    pub edges: BTreeMap<String, BTreeSet<String>>,
}

impl CrateShape {
    /// The strongly connected sets of more than one module.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        cycles(&self.edges)
    }
}

/// Walks the crate rooted at `root` (a path relative to `workspace`).
pub fn walk_crate(workspace: &Path, root: &str) -> Result<CrateShape> {
    let mut shape = CrateShape {
        root: root.into(),
        ..CrateShape::default()
    };
    let path = workspace.join(root);
    let dir = path.parent().context("crate root without a directory")?;
    walk_file(workspace, &path, dir, &[], &mut shape)?;
    Ok(shape)
}

fn walk_file(
    workspace: &Path,
    path: &Path,
    dir: &Path,
    module: &[String],
    shape: &mut CrateShape,
) -> Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let file: File =
        syn::parse_file(&text).with_context(|| format!("parsing {}", path.display()))?;
    let rel = path.strip_prefix(workspace).unwrap_or(path).to_path_buf();
    shape.files.push((rel.clone(), text.lines().count()));
    walk_items(workspace, &rel, &file.items, dir, module, shape)
}

fn walk_items(
    workspace: &Path,
    file: &Path,
    items: &[Item],
    dir: &Path,
    module: &[String],
    shape: &mut CrateShape,
) -> Result<()> {
    let mut reader = Reader {
        file,
        module,
        shape,
        owner: None,
    };
    for item in items {
        if is_test_only(item_attrs(item)) {
            continue;
        }
        match item {
            Item::Mod(m) => reader.shape_mod(workspace, m, dir)?,
            _ => reader.visit_item(item),
        }
    }
    Ok(())
}

/// Reads one file's items: functions and module references.
struct Reader<'a> {
    file: &'a Path,
    module: &'a [String],
    shape: &'a mut CrateShape,
    /// The type whose `impl` is being read.
    owner: Option<String>,
}

impl Reader<'_> {
    fn shape_mod(&mut self, workspace: &Path, m: &ItemMod, dir: &Path) -> Result<()> {
        let name = m.ident.to_string();
        let mut module = self.module.to_vec();
        module.push(name.clone());
        let child_dir = dir.join(&name);
        match &m.content {
            Some((_, items)) => {
                walk_items(workspace, self.file, items, &child_dir, &module, self.shape)
            }
            None => {
                let flat = dir.join(format!("{name}.rs"));
                let nested = child_dir.join("mod.rs");
                let path = if flat.exists() { flat } else { nested };
                if !path.exists() {
                    bail!("{}: module {name} has no file", self.file.display());
                }
                walk_file(workspace, &path, &child_dir, &module, self.shape)
            }
        }
    }

    fn function(&mut self, sig: &Signature, body: &Block) {
        let mut path = self.module.to_vec();
        if let Some(owner) = &self.owner {
            path.push(owner.clone());
        }
        path.push(sig.ident.to_string());
        let line = sig.fn_token.span.start().line;
        let end = body.brace_token.span.close();
        self.shape.functions.push(Function {
            file: self.file.to_path_buf(),
            name: path.join("::"),
            line,
            lines: end.end().line + 1 - line,
        });
    }

    /// `crate::x...` or `super::...`: the top-level module it names.
    fn reference(&mut self, segments: &[String]) {
        let Some(top) = self.module.first() else {
            return; // the crate root names everything; it is no module
        };
        let target = match segments.first().map(String::as_str) {
            Some("crate") => segments.get(1).cloned(),
            Some("super") => {
                let supers = segments.iter().take_while(|s| *s == "super").count();
                let depth = self.module.len().checked_sub(supers);
                match depth {
                    Some(0) => segments.get(supers).cloned(),
                    Some(_) => Some(top.clone()),
                    None => None,
                }
            }
            _ => None,
        };
        if let Some(target) = target
            && target != *top
            && target
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase())
        {
            self.shape
                .edges
                .entry(top.clone())
                .or_default()
                .insert(target);
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        if is_test_only(&f.attrs) {
            return;
        }
        self.function(&f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        if is_test_only(&f.attrs) {
            return;
        }
        self.function(&f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast TraitItemFn) {
        if let Some(block) = &f.default {
            self.function(&f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if is_test_only(&i.attrs) {
            return;
        }
        let owner = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let outer = std::mem::replace(&mut self.owner, owner);
        visit::visit_item_impl(self, i);
        self.owner = outer;
    }

    fn visit_item_mod(&mut self, _: &'ast ItemMod) {
        // Inline modules inside functions or impls do not occur in lb;
        // top-level ones are walked by `shape_mod`.
    }

    fn visit_item_use(&mut self, u: &'ast ItemUse) {
        for path in use_paths(&u.tree, Vec::new()) {
            self.reference(&path);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.reference(&segments);
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // Paths inside macro calls (`format!`, `matches!`) are tokens to
        // syn; the ones lb writes there name types already imported.
        visit::visit_macro(self, m);
    }
}

/// Every path a `use` tree names, as segments.
fn use_paths(tree: &UseTree, prefix: Vec<String>) -> Vec<Vec<String>> {
    let with = |s: String| {
        let mut p = prefix.clone();
        p.push(s);
        p
    };
    match tree {
        UseTree::Path(p) => use_paths(&p.tree, with(p.ident.to_string())),
        UseTree::Name(n) => vec![with(n.ident.to_string())],
        UseTree::Rename(r) => vec![with(r.ident.to_string())],
        UseTree::Glob(_) => vec![prefix],
        UseTree::Group(g) => g
            .items
            .iter()
            .flat_map(|t| use_paths(t, prefix.clone()))
            .collect(),
    }
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Fn(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::Const(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]` or `#[test]`: compiled only for tests.
fn is_test_only(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("test") {
            return true;
        }
        path.is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
    })
}

/// Tarjan's strongly connected components of more than one node, each
/// sorted, in a stable order.
pub fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|x| *x == v).unwrap_or(0);
                let mut set: Vec<String> = self.stack.drain(at..).map(String::from).collect();
                if set.len() > 1 {
                    set.sort();
                    self.found.push(set);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    let nodes: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(k, v)| std::iter::once(k.as_str()).chain(v.iter().map(String::as_str)))
        .collect();
    for n in nodes {
        if !t.index.contains_key(n) {
            t.visit(n);
        }
    }
    t.found.sort();
    t.found
}

/// The workspace this xtask belongs to.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

/// Prints the figures of the workspace at `ws` (default: this one):
/// largest files, long functions, cycles.
pub fn report(ws: Option<PathBuf>) -> Result<()> {
    let ws = ws.unwrap_or_else(workspace);
    let mut files = Vec::new();
    let mut long = Vec::new();
    let mut total = 0;
    for root in crate_roots(&ws)? {
        let shape = walk_crate(&ws, &root)?;
        let cycles = shape.cycles();
        println!(
            "{}: {} files, {} functions, cycles: {}",
            shape.root.display(),
            shape.files.len(),
            shape.functions.len(),
            if cycles.is_empty() {
                "none".to_string()
            } else {
                format!("{cycles:?}")
            }
        );
        total += shape.functions.len();
        long.extend(
            shape
                .functions
                .into_iter()
                .filter(|f| f.lines > MAX_FN_LINES),
        );
        files.extend(shape.files);
    }
    files.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    files.dedup();
    println!("\nlargest files (runtime code, lines):");
    for (f, n) in files.iter().take(5) {
        println!("  {n:5}  {}", f.display());
    }
    long.sort_by_key(|f| std::cmp::Reverse(f.lines));
    println!(
        "\nfunctions over {MAX_FN_LINES} lines: {} of {total}",
        long.len()
    );
    for f in &long {
        println!(
            "  {:4}  {} ({}:{})",
            f.lines,
            f.name,
            f.file.display(),
            f.line
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Functions allowed over the limit: tables, one entry per line.
    const TABLES: &[&str] = &[];

    fn shapes() -> Vec<CrateShape> {
        let ws = workspace();
        let roots = crate_roots(&ws).expect("the crates are where they were");
        assert!(roots.len() >= 7, "{roots:?}");
        roots
            .iter()
            .map(|r| walk_crate(&ws, r).expect("the crate parses"))
            .collect()
    }

    #[test]
    fn no_crate_has_a_module_cycle() {
        for shape in shapes() {
            assert!(
                shape.cycles().is_empty(),
                "{}: modules in a cycle: {:?}\nedges: {:#?}",
                shape.root.display(),
                shape.cycles(),
                shape.edges
            );
        }
    }

    #[test]
    fn no_runtime_function_is_over_the_limit() {
        let shapes = shapes();
        let long: Vec<String> = shapes
            .iter()
            .flat_map(|s| &s.functions)
            .filter(|f| f.lines > MAX_FN_LINES && !TABLES.contains(&f.name.as_str()))
            .map(|f| {
                format!(
                    "{} ({} lines, {}:{})",
                    f.name,
                    f.lines,
                    f.file.display(),
                    f.line
                )
            })
            .collect();
        assert!(long.is_empty(), "split these functions: {long:#?}");
        // The walk found the code it is meant to hold to the rule.
        let lib = shapes
            .iter()
            .find(|s| s.root == Path::new("lb-userspace/src/lib.rs"))
            .expect("the library was walked");
        assert!(
            lib.functions
                .iter()
                .any(|f| f.name == "daemon::requests::Daemon::handle")
        );
        assert!(lib.files.len() > 30, "{} files", lib.files.len());
    }

    fn shape_of(text: &str, module: &[&str]) -> CrateShape {
        let file: File = syn::parse_file(text).expect("test source parses");
        let mut shape = CrateShape::default();
        let module: Vec<String> = module.iter().map(ToString::to_string).collect();
        let mut reader = Reader {
            file: Path::new("x.rs"),
            module: &module,
            shape: &mut shape,
            owner: None,
        };
        for item in &file.items {
            if !is_test_only(item_attrs(item)) {
                reader.visit_item(item);
            }
        }
        shape
    }

    #[test]
    fn references_and_lengths_are_read_from_the_syntax() {
        let shape = shape_of(
            "use crate::{a::X, b};\n\
             use super::c::Y;\n\
             impl T {\n    fn m(&self) {\n        crate::d::f();\n    }\n}\n\
             #[cfg(test)]\nmod tests { use crate::e; }\n\
             #[test]\nfn t() { crate::e::g(); }\n",
            &["top", "sub"],
        );
        let named: Vec<&str> = shape.edges["top"].iter().map(String::as_str).collect();
        // `super::c` from top::sub is top::c: inside the same top module.
        assert_eq!(named, ["a", "b", "d"]);
        assert_eq!(shape.functions.len(), 1, "{:?}", shape.functions);
        assert_eq!(shape.functions[0].name, "top::sub::T::m");
        assert_eq!((shape.functions[0].line, shape.functions[0].lines), (4, 3));
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let graph = |pairs: &[(&str, &str)]| {
            let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for (a, b) in pairs {
                e.entry(a.to_string()).or_default().insert(b.to_string());
            }
            e
        };
        assert!(cycles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        assert_eq!(
            cycles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }
}
