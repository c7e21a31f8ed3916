//! `cargo xtask structure`: the shape of the runtime code, read with a
//! real Rust parser (`syn`). Each crate is walked from its root through
//! its `mod` declarations, leaving out what is compiled only for tests
//! (`#[cfg(test)]` modules and `#[test]` functions), so that:
//!
//! - the module graph of each crate is drawn from the paths its code
//!   names (`use` trees, paths in code, and paths written as strings in
//!   attributes such as `#[serde(with = "crate::x::y")]`), at every level:
//!   a reference from `a::b::c` to `a::d::e` is an edge between the
//!   siblings `a::b` → `a::d`, one between top-level modules if they
//!   differ at the top. Names re-exported with `use` are followed to the
//!   module that defines them. Cycles (strongly connected sets) are
//!   listed; a reference between a module and its own ancestor (a
//!   parent's shared types, a child's items) is containment, not an edge;
//! - every function's length is measured from `fn` to its closing brace;
//! - the modules a caller outside the crate can name are listed (`pub`
//!   all the way from the root), so the library's surface stays its
//!   top-level facades.
//!
//! The suite holds them to the rules in ARCHITECTURE.md (no cycle, no
//! function over [`MAX_FN_LINES`] unless it is a table, no public module
//! below a facade) through this module's tests.

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
    /// Module (`a::b`) → the sibling modules it names (see the module
    /// doc), at every level of the tree.
    pub edges: BTreeMap<String, BTreeSet<String>>,
    /// Every module of the crate, by path (the root is empty).
    modules: BTreeSet<Vec<String>>,
    /// The modules a caller outside the crate can name: `pub`, in a
    /// module it can name (the root included).
    pub public_modules: BTreeSet<Vec<String>>,
    /// Each path a module names: (module, path as written).
    refs: Vec<(Vec<String>, Vec<String>)>,
    /// `use` bindings: (module, name) → path as written there.
    uses: BTreeMap<(Vec<String>, String), Vec<String>>,
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
    shape.modules.insert(Vec::new());
    shape.public_modules.insert(Vec::new());
    walk_file(workspace, &path, dir, &[], &mut shape)?;
    shape.draw_edges();
    Ok(shape)
}

impl CrateShape {
    /// The module a path written in `module` lands in: `crate::`,
    /// `super::`, `self::` or a child module's name, the longest prefix
    /// that is a module, then through `use` re-exports (a bounded number
    /// of hops). `None` for other crates' paths.
    fn resolve(&self, module: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut abs = absolute(module, path, &self.modules)?;
        for _ in 0..8 {
            let m = (0..=abs.len())
                .rev()
                .map(|n| &abs[..n])
                .find(|p| self.modules.contains(*p))?
                .to_vec();
            let Some(next) = abs.get(m.len()) else {
                return Some(m);
            };
            let Some(target) = self.uses.get(&(m.clone(), next.clone())) else {
                return Some(m);
            };
            let mut hop = absolute(&m, target, &self.modules)?;
            hop.extend_from_slice(&abs[m.len() + 1..]);
            if hop == abs {
                return Some(m);
            }
            abs = hop;
        }
        None
    }

    /// Turns the references into sibling edges (see the module doc).
    fn draw_edges(&mut self) {
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, path) in &self.refs {
            let Some(to) = self.resolve(from, path) else {
                continue;
            };
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue; // an ancestor or a descendant: containment
            }
            edges
                .entry(from[..=common].join("::"))
                .or_default()
                .insert(to[..=common].join("::"));
        }
        self.edges = edges;
    }
}

/// `path` as written in `module`, from the crate root, if it names this
/// crate (`crate::`, `super::`, `self::`, or a child module of `module`).
fn absolute(
    module: &[String],
    path: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut abs = match first.as_str() {
        "crate" => return Some(path[1..].to_vec()),
        "self" => module.to_vec(),
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            let mut abs = module.get(..module.len().checked_sub(supers)?)?.to_vec();
            abs.extend_from_slice(&path[supers..]);
            return Some(abs);
        }
        _ => {
            let mut child = module.to_vec();
            child.push(first.clone());
            if !modules.contains(&child) {
                return None;
            }
            return Some([module, path].concat());
        }
    };
    abs.extend_from_slice(&path[1..]);
    Some(abs)
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
        self.shape.modules.insert(module.clone());
        if matches!(m.vis, syn::Visibility::Public(_))
            && self.shape.public_modules.contains(self.module)
        {
            self.shape.public_modules.insert(module.clone());
        }
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

    /// A path named in this module, resolved once the walk knows every
    /// module ([`CrateShape::draw_edges`]).
    fn reference(&mut self, segments: &[String]) {
        if !segments.is_empty() {
            self.shape
                .refs
                .push((self.module.to_vec(), segments.to_vec()));
        }
    }

    /// Paths written as strings in an attribute's arguments (`serde`'s
    /// `with`, `default`, `deserialize_with`...): a dependency the
    /// compiler follows and a reader of the code does not see.
    fn attribute_paths(&mut self, a: &Attribute) {
        let syn::Meta::List(list) = &a.meta else {
            return;
        };
        let text = list.tokens.to_string();
        for quoted in text.split('"').skip(1).step_by(2) {
            if let Ok(path) = syn::parse_str::<syn::Path>(quoted)
                && path.segments.len() > 1
            {
                let segments: Vec<String> =
                    path.segments.iter().map(|s| s.ident.to_string()).collect();
                self.reference(&segments);
            }
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
        for (name, path) in use_paths(&u.tree, Vec::new()) {
            if let Some(name) = name {
                self.shape
                    .uses
                    .insert((self.module.to_vec(), name), path.clone());
            }
            self.reference(&path);
        }
    }

    fn visit_attribute(&mut self, a: &'ast Attribute) {
        self.attribute_paths(a);
        visit::visit_attribute(self, a);
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

/// Every path a `use` tree names, as segments, with the name it binds
/// there (none for a glob; `a::{self}` binds `a`).
fn use_paths(tree: &UseTree, prefix: Vec<String>) -> Vec<(Option<String>, Vec<String>)> {
    let with = |s: String| {
        let mut p = prefix.clone();
        p.push(s);
        p
    };
    match tree {
        UseTree::Path(p) => use_paths(&p.tree, with(p.ident.to_string())),
        UseTree::Name(n) if n.ident == "self" => {
            vec![(prefix.last().cloned(), prefix.clone())]
        }
        UseTree::Name(n) => vec![(Some(n.ident.to_string()), with(n.ident.to_string()))],
        UseTree::Rename(r) => vec![(Some(r.rename.to_string()), with(r.ident.to_string()))],
        UseTree::Glob(_) => vec![(None, prefix)],
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

/// The `## Code map` section of ARCHITECTURE.md as its bullets, each the
/// set of names it writes in backticks (`a/{b,c}.rs` spelled out).
pub fn code_map(architecture: &str) -> Vec<BTreeSet<String>> {
    let start = architecture.find("\n## Code map").map_or(0, |s| s + 1);
    let section = &architecture[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    section[..end]
        .split("\n- ")
        .skip(1)
        .map(|bullet| {
            bullet
                .split('`')
                .skip(1)
                .step_by(2)
                .flat_map(expand_braces)
                .collect()
        })
        .collect()
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (one group).
fn expand_braces(name: &str) -> Vec<String> {
    match (name.find('{'), name.find('}')) {
        (Some(open), Some(close)) if open < close => name[open + 1..close]
            .split(',')
            .map(|part| format!("{}{part}{}", &name[..open], &name[close + 1..]))
            .collect(),
        _ => vec![name.to_string()],
    }
}

/// Whether the code map names `file` (a path from the workspace root):
/// by its path; by a tail of it with a directory (`daemon/commit.rs`);
/// by its name, or its path below the directory, in the entry of a
/// directory holding it (`lb-ebpf/src/bin/lb-xdp/` … `maps.rs`), or in
/// the entry of a file beside it; a directory's `mod.rs`, `main.rs` or
/// `lib.rs` by the directory's entry. Unit tests inside `src/` (a
/// `tests.rs`, or a file under a `tests/` directory there) belong to the
/// module beside them.
pub fn in_code_map(map: &[BTreeSet<String>], file: &str) -> bool {
    if file.contains("/src/")
        && (file.ends_with("/tests.rs")
            || file
                .split("/src/")
                .nth(1)
                .is_some_and(|r| r.contains("tests/")))
    {
        return true;
    }
    let (dir, base) = file.rsplit_once('/').map_or(("", file), |(d, b)| (d, b));
    map.iter().any(|names| {
        names.contains(file)
            || names.iter().any(|name| {
                let rest = name
                    .ends_with('/')
                    .then(|| file.strip_prefix(name.as_str()))
                    .flatten();
                (name.contains('/') && name.ends_with(".rs") && file.ends_with(&format!("/{name}")))
                    || rest.is_some_and(|rest| {
                        names.contains(rest)
                            || names.contains(base)
                            || ["mod.rs", "main.rs", "lib.rs"].contains(&rest)
                            || names
                                .iter()
                                .any(|sub| sub.ends_with('/') && rest.starts_with(sub.as_str()))
                    })
                    || (name.ends_with(".rs")
                        && name.rsplit_once('/').is_some_and(|(d, _)| d == dir)
                        && names.contains(base))
            })
    })
}

/// The Rust files of the workspace at `ws` that git tracks, or that are
/// new and not ignored, and exist.
pub fn rust_files(ws: &Path) -> Result<Vec<String>> {
    let out = std::process::Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.rs",
        ])
        .current_dir(ws)
        .output()
        .context("running git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed in {}", ws.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|f| ws.join(f).exists())
        .map(String::from)
        .collect())
}

/// The files of [`rust_files`] that ARCHITECTURE.md's code map does not
/// name.
pub fn unmapped_files(ws: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(ws.join("ARCHITECTURE.md")).context("ARCHITECTURE.md")?;
    let map = code_map(&text);
    Ok(rust_files(ws)?
        .into_iter()
        .filter(|f| !in_code_map(&map, f))
        .collect())
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
            "{}: {} files, {} functions, {} public modules, cycles: {}",
            shape.root.display(),
            shape.files.len(),
            shape.functions.len(),
            // The root is one of them, and callers name it by the crate.
            shape.public_modules.len() - 1,
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
    let unmapped = unmapped_files(&ws)?;
    println!(
        "\nfiles ARCHITECTURE.md's code map does not name: {} of {}",
        unmapped.len(),
        rust_files(&ws)?.len()
    );
    for f in &unmapped {
        println!("  {f}");
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
             #[derive(Deserialize)]\nstruct S { #[serde(with = \"crate::g::h\")] s: u8 }\n\
             #[cfg(test)]\nmod tests { use crate::e; }\n\
             #[test]\nfn t() { crate::e::g(); }\n",
            &["top", "sub"],
        );
        let named: Vec<String> = shape.refs.iter().map(|(_, p)| p.join("::")).collect();
        for want in [
            "crate::a::X",
            "crate::b",
            "super::c::Y",
            "crate::d::f",
            "crate::g::h",
        ] {
            assert!(named.iter().any(|n| n == want), "{want} not in {named:?}");
        }
        assert!(
            !named.iter().any(|n| n.starts_with("crate::e")),
            "{named:?}"
        );
        assert_eq!(
            shape.uses[&(vec!["top".into(), "sub".into()], "Y".to_string())],
            ["super", "c", "Y"]
        );
        assert_eq!(shape.functions.len(), 1, "{:?}", shape.functions);
        assert_eq!(shape.functions[0].name, "top::sub::T::m");
        assert_eq!((shape.functions[0].line, shape.functions[0].lines), (4, 3));
    }

    /// A crate written into a scratch directory, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(files: &[(&str, &str)]) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "lb-structure-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            for (name, text) in files {
                let path = dir.join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The sentinel: cycles the old check could not see (between two
    /// files of one directory module; through a re-export; through a
    /// path in a `serde` attribute) are caught, and the same crate
    /// without them has none.
    #[test]
    fn planted_cycles_inside_a_module_and_in_attributes_are_caught() {
        let lib = "mod config;\nmod passive;\n";
        let config = "mod health;\nmod vip;\npub use vip::Vip;\n";
        let health = "pub struct Check;\nfn f(_: crate::config::Vip) {}\n";
        let vip_clean = "pub struct Vip;\n";
        let vip_cycle = "pub struct Vip;\nuse super::health::Check;\n";
        let passive = "pub fn secs() {}\nfn g() { crate::config::f(); }\n";
        let config_attr = "mod health;\nmod vip;\npub use vip::Vip;\n\
            pub fn f() {}\n\
            struct S { #[serde(default = \"crate::passive::secs\")] s: u8 }\n";
        let walk = |files: &[(&str, &str)]| {
            let scratch = Scratch::new(files);
            let shape = walk_crate(&scratch.0, "src/lib.rs").expect("scratch crate parses");
            (shape.cycles(), shape.edges)
        };
        let (clean, edges) = walk(&[
            ("src/lib.rs", lib),
            ("src/config/mod.rs", config),
            ("src/config/health.rs", health),
            ("src/config/vip.rs", vip_clean),
            ("src/passive.rs", "pub fn secs() {}\n"),
        ]);
        assert!(clean.is_empty(), "{clean:?}");
        // health → vip through config's re-export.
        assert!(edges["config::health"].contains("config::vip"), "{edges:?}");
        let (inner, _) = walk(&[
            ("src/lib.rs", lib),
            ("src/config/mod.rs", config),
            ("src/config/health.rs", health),
            ("src/config/vip.rs", vip_cycle),
            ("src/passive.rs", "pub fn secs() {}\n"),
        ]);
        assert_eq!(
            inner,
            vec![vec!["config::health".to_string(), "config::vip".into()]]
        );
        let (attr, _) = walk(&[
            ("src/lib.rs", lib),
            ("src/config/mod.rs", config_attr),
            ("src/config/health.rs", health),
            ("src/config/vip.rs", vip_clean),
            ("src/passive.rs", passive),
        ]);
        assert_eq!(attr, vec![vec!["config".to_string(), "passive".into()]]);
    }

    /// Every Rust file of the workspace that git tracks (or that is new
    /// and not ignored) is named in ARCHITECTURE.md's code map.
    #[test]
    fn the_library_exposes_its_facades_and_nothing_below_them() {
        let lib = walk_crate(&workspace(), "lb-userspace/src/lib.rs").expect("the library parses");
        let deep: Vec<String> = lib
            .public_modules
            .iter()
            .filter(|m| m.len() > 1)
            .map(|m| m.join("::"))
            .collect();
        assert!(
            deep.is_empty(),
            "modules a caller can reach below a facade (make them pub(crate) and \
             re-export what callers use from the facade): {deep:?}"
        );
        let facades = lib.public_modules.iter().filter(|m| m.len() == 1).count();
        assert!(
            facades >= 10,
            "{facades} facades: the walk lost the library's modules"
        );
    }

    #[test]
    fn a_public_module_inside_a_crate_private_one_is_not_reachable() {
        let file: File = syn::parse_file(
            "pub mod a { pub mod b {} pub(crate) mod c { pub mod d {} } }\n\
             mod e { pub mod f {} }\n",
        )
        .expect("test source parses");
        let mut shape = CrateShape::default();
        shape.public_modules.insert(Vec::new());
        let here = Path::new(".");
        walk_items(here, here, &file.items, here, &[], &mut shape).expect("inline modules");
        assert_eq!(shape.modules.len(), 6, "{:?}", shape.modules);
        let reachable: Vec<String> = shape.public_modules.iter().map(|m| m.join("::")).collect();
        assert_eq!(reachable, ["", "a", "a::b"], "{reachable:?}");
    }

    #[test]
    fn every_source_file_is_in_the_code_map() {
        let ws = workspace();
        let text = std::fs::read_to_string(ws.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        assert!(code_map(&text).len() > 40, "the code map was found");
        let files = rust_files(&ws).expect("git lists the files");
        assert!(files.len() > 150, "{} files", files.len());
        let missing = unmapped_files(&ws).expect("the check runs");
        assert!(
            missing.is_empty(),
            "ARCHITECTURE.md's code map does not name these files: {missing:#?}"
        );
    }

    #[test]
    fn the_code_map_check_catches_a_file_it_does_not_name() {
        let map = code_map(
            "# A\n\n## Code map\n\n- `a/src/{x,y}.rs` — two.\n- `a/src/d/` — `mod.rs`, `k.rs`; \
             `sub/`.\n- `a/src/m.rs` — and `n.rs` beside it.\n\n## Next\n- `a/src/z.rs`\n",
        );
        for named in [
            "a/src/x.rs",
            "a/src/y.rs",
            "a/src/d/mod.rs",
            "a/src/d/k.rs",
            "a/src/d/sub/q.rs",
            "a/src/n.rs",
            "a/src/d/tests.rs",
        ] {
            assert!(in_code_map(&map, named), "{named}");
        }
        for unnamed in ["a/src/z.rs", "a/src/d/j.rs", "a/src/e/k.rs", "b/src/x.rs"] {
            assert!(!in_code_map(&map, unnamed), "{unnamed}");
        }
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
