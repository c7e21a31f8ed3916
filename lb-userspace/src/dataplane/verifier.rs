//! A program the kernel's verifier refused: what an operator needs to read
//! (the verdict, the failing instruction, the last lines before it, the
//! kernel's release) in one short message, and the whole log kept apart
//! for a file (it runs to thousands of lines; printing it into a journal
//! buries the one line that matters).
//!
//! Not here: deciding where the file goes (`lbd` puts it beside its state
//! file) or retrying with other programs.

use std::{
    fmt,
    path::{Path, PathBuf},
};

/// Lines of the log's end shown in the message.
pub const TAIL_LINES: usize = 12;

/// The verifier's refusal of one program.
#[derive(Debug)]
pub struct Rejection {
    /// The program's name (`lb_xdp`, `lb_decap`, ...).
    pub program: &'static str,
    /// What `BPF_PROG_LOAD` returned.
    pub errno: std::io::Error,
    /// The kernel's release (`uname -r`), or empty if unknown.
    pub kernel: String,
    /// The verifier's whole log.
    pub log: String,
    /// Where the whole log was written, once it was.
    pub saved: Option<PathBuf>,
}

impl Rejection {
    /// The refusal in `error`, if it is one (a load that the verifier
    /// answered); otherwise `error` back.
    pub fn from_error(
        program: &'static str,
        error: aya::programs::ProgramError,
    ) -> Result<Rejection, aya::programs::ProgramError> {
        match error {
            aya::programs::ProgramError::LoadError {
                io_error,
                verifier_log,
            } => Ok(Rejection {
                program,
                errno: io_error,
                kernel: kernel_release(),
                log: verifier_log.to_string(),
                saved: None,
            }),
            other => Err(other),
        }
    }

    /// The log's lines without the statistics the verifier appends
    /// (`verification time`, `stack depth`, `processed N insns`).
    fn lines(&self) -> Vec<&str> {
        let mut lines: Vec<&str> = self
            .log
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .collect();
        while let Some(last) = lines.last()
            && is_statistics(last)
        {
            lines.pop();
        }
        lines
    }

    /// The verifier's own reason: the last line of the log that is not a
    /// statistic (`R3 invalid mem access 'scalar'`).
    pub fn verdict(&self) -> Option<&str> {
        self.lines().last().copied()
    }

    /// The last instruction the verifier walked before the verdict
    /// (`2330: (69) r4 = *(u16 *)(r3 +48)`).
    pub fn failing_instruction(&self) -> Option<&str> {
        self.lines().into_iter().rev().find(|l| is_instruction(l))
    }

    /// The last [`TAIL_LINES`] lines before the statistics.
    pub fn tail(&self) -> Vec<&str> {
        let lines = self.lines();
        let from = lines.len().saturating_sub(TAIL_LINES);
        lines[from..].to_vec()
    }

    /// The verifier's statistics line (`processed 11617 insns ...`).
    pub fn statistics(&self) -> Option<&str> {
        self.log
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("processed ") && l.contains(" insns"))
    }

    /// Writes the whole log to `path` (private, replaced whole) and
    /// remembers where.
    pub fn save(&mut self, path: &Path) -> std::io::Result<()> {
        crate::atomic_file::write_private(path, self.log.as_bytes())?;
        self.saved = Some(path.to_path_buf());
        Ok(())
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kernel = if self.kernel.is_empty() {
            "this kernel".to_string()
        } else {
            format!("Linux {}", self.kernel)
        };
        write!(
            f,
            "the verifier of {kernel} refused program {} ({}): {}",
            self.program,
            self.errno,
            self.verdict().unwrap_or("no verifier output")
        )?;
        if let Some(insn) = self.failing_instruction() {
            write!(f, " at instruction {insn}")?;
        }
        if let Some(stats) = self.statistics() {
            write!(f, " ({stats})")?;
        }
        write!(f, "; the log ends:")?;
        for line in self.tail() {
            write!(f, "\n    {line}")?;
        }
        match &self.saved {
            Some(path) => write!(f, "\nthe whole verifier log is in {}", path.display()),
            None => Ok(()),
        }
    }
}

fn is_statistics(line: &str) -> bool {
    let l = line.trim();
    l.starts_with("verification time")
        || l.starts_with("stack depth")
        || (l.starts_with("processed ") && l.contains(" insns"))
}

/// `2330: (69) r4 = ...`: an instruction as the verifier prints it.
fn is_instruction(line: &str) -> bool {
    let Some((index, rest)) = line.split_once(':') else {
        return false;
    };
    !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
        && rest.trim_start().starts_with('(')
}

/// The running kernel's release, from `/proc`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of Linux 6.1's refusal of `lb_xdp` before it was fixed
    /// (Debian 12's kernel), as the kernel printed it.
    const LOG_6_1: &str = "\
func#0 @0
0: R1=ctx(off=0,imm=0) R10=fp0
; match conntrack::insert(bucket, tag, def.handle, now, answered.is_some()) {
2327: (79) r1 = *(u64 *)(r10 -256)    ; R1_w=map_value(off=0,ks=4,vs=32,imm=0) R10=fp0
2328: (61) r1 = *(u32 *)(r1 +16)      ; R1_w=scalar(umax=4294967295,var_off=(0x0; 0xffffffff))
2329: (79) r3 = *(u64 *)(r10 -248)    ; R3_w=P0 R10=fp0
; (*bucket).stamps[way],
2330: (69) r4 = *(u16 *)(r3 +48)
R3 invalid mem access 'scalar'
verification time 462746 usec
stack depth 352+0
processed 11617 insns (limit 1000000) max_states_per_insn 11 total_states 708 peak_states 597 mark_read 60
";

    fn rejection(log: &str) -> Rejection {
        Rejection {
            program: "lb_xdp",
            errno: std::io::Error::from_raw_os_error(libc::EACCES),
            kernel: "6.1.0-50-amd64".into(),
            log: log.into(),
            saved: None,
        }
    }

    #[test]
    fn the_message_names_the_verdict_the_instruction_and_the_kernel() {
        let r = rejection(LOG_6_1);
        assert_eq!(r.verdict(), Some("R3 invalid mem access 'scalar'"));
        assert_eq!(
            r.failing_instruction(),
            Some("2330: (69) r4 = *(u16 *)(r3 +48)")
        );
        let text = r.to_string();
        assert!(
            text.starts_with(
                "the verifier of Linux 6.1.0-50-amd64 refused program lb_xdp (Permission denied (os error 13)): R3 invalid mem access 'scalar' at instruction 2330: (69) r4 = *(u16 *)(r3 +48) (processed 11617 insns"
            ),
            "{text}"
        );
        // The statistics are not repeated in the tail, the verdict ends it.
        assert_eq!(r.tail().last(), Some(&"R3 invalid mem access 'scalar'"));
        assert!(!text.contains("verification time"), "{text}");
    }

    #[test]
    fn the_message_is_short_however_long_the_log() {
        let mut log = String::new();
        for i in 0..5000 {
            log.push_str(&format!("{i}: (b7) r1 = {i}\n"));
        }
        log.push_str(LOG_6_1);
        let r = rejection(&log);
        let text = r.to_string();
        assert_eq!(text.lines().count(), 1 + TAIL_LINES, "{text}");
        assert!(text.contains("2330: (69)"), "{text}");
    }

    #[test]
    fn the_whole_log_goes_to_the_file_the_message_names() {
        let dir = crate::scratch::ScratchDir::new("verifier");
        let path = dir.join("lb_xdp.verifier.log");
        let mut r = rejection(LOG_6_1);
        r.save(&path).expect("write the log");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), LOG_6_1);
        assert!(
            r.to_string()
                .ends_with(&format!("the whole verifier log is in {}", path.display())),
            "{r}"
        );
    }

    #[test]
    fn an_empty_log_still_reads() {
        let r = rejection("");
        assert_eq!(r.verdict(), None);
        assert!(r.to_string().contains("no verifier output"), "{r}");
    }
}
