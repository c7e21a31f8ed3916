//! `lbctl top`: the balancer live, as `ipvsadm -Ln --rate` or `htop`
//! show theirs. A full-screen view (ratatui) refreshed every interval:
//! the totals (packets, new flows, drops and malformed packets by reason,
//! per second), BGP peers and BFD when configured, and one line per VIP
//! and per backend (state, live flows, pps, bps), sorted by a column
//! (`s` cycles it, `r` reverses), `q` quits. Off a terminal, or with
//! `--once`, it prints one plain snapshot of the same lines; with `-o
//! json`, the three answers it reads (`stats`, `health`, `bgp`).
//!
//! Each refresh asks `lbd` for `stats`, `health` and `bgp` (each given
//! up after 2 s, so a stuck `lbd` cannot freeze the screen: the last view
//! stays, marked stale); the rates are `lbd`'s own (over its sampling
//! interval).

use std::{
    io::IsTerminal as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::ValueEnum;
use lb::api::{self, AnnounceStatus, Request, Stats, VipHealth};
use ratatui::{
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    widgets::{Paragraph, Row, Table},
};

#[derive(clap::Args)]
pub struct TopArgs {
    /// Print one plain snapshot and exit (also what happens off a
    /// terminal).
    #[arg(long)]
    once: bool,
    /// Refresh every this many seconds.
    #[arg(long, default_value_t = 1.0, value_parser = interval)]
    interval: f64,
    /// The column to sort by (most first; s cycles it, r reverses).
    #[arg(long, value_enum, default_value_t = Sort::Pps)]
    sort: Sort,
}

fn interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.2..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: an interval is 0.2 to 60 seconds")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Sort {
    Pps,
    Bps,
    Flows,
    Name,
}

impl Sort {
    fn next(self) -> Self {
        match self {
            Sort::Pps => Sort::Bps,
            Sort::Bps => Sort::Flows,
            Sort::Flows => Sort::Name,
            Sort::Name => Sort::Pps,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sort::Pps => "pps",
            Sort::Bps => "bps",
            Sort::Flows => "live flows",
            Sort::Name => "name",
        }
    }
}

/// How long one answer may take before the view calls `lbd` stuck.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// What one refresh read from `lbd`.
#[derive(serde::Serialize)]
pub struct Snapshot {
    stats: Stats,
    health: Vec<VipHealth>,
    bgp: AnnounceStatus,
}

impl Snapshot {
    fn read(socket: &Path) -> Result<Self> {
        Ok(Self {
            stats: serde_json::from_value(ask(socket, Request::Stats)?)?,
            health: serde_json::from_value(ask(socket, Request::Health)?)?,
            bgp: serde_json::from_value(ask(socket, Request::Bgp)?)?,
        })
    }
}

fn ask(socket: &Path, request: Request) -> Result<serde_json::Value> {
    Ok(api::call_within(socket, &request, ANSWER_TIMEOUT)?)
}

/// One line of the VIP table: a VIP, then its backends indented.
#[derive(Clone, Debug, PartialEq)]
struct Line {
    name: String,
    state: String,
    flows: Option<u64>,
    pps: f64,
    bps: f64,
}

impl Line {
    fn cells(&self) -> [String; 5] {
        [
            self.name.clone(),
            self.state.clone(),
            self.flows.map_or("-".into(), |n| n.to_string()),
            format!("{:.0}", self.pps),
            // lbd's `bps` is bits per second already.
            crate::print::si(self.bps),
        ]
    }
}

/// The VIPs (sorted by `sort`, `reverse`d on demand), each followed by
/// its backends sorted the same way.
fn lines(s: &Snapshot, sort: Sort, reverse: bool) -> Vec<Line> {
    let order = |a: &Line, b: &Line| {
        let o = match sort {
            Sort::Pps => b.pps.total_cmp(&a.pps),
            Sort::Bps => b.bps.total_cmp(&a.bps),
            Sort::Flows => b.flows.cmp(&a.flows),
            Sort::Name => a.name.cmp(&b.name),
        }
        .then_with(|| a.name.cmp(&b.name));
        if reverse { o.reverse() } else { o }
    };
    let mut vips: Vec<(Line, Vec<Line>)> = s
        .health
        .iter()
        .map(|v| {
            let stats = s.stats.vips.iter().find(|x| x.vip == v.vip);
            let mut backends: Vec<Line> = v
                .backends
                .iter()
                .map(|b| {
                    let rate = stats
                        .and_then(|x| x.backends.iter().find(|r| r.address == b.address))
                        .map(|r| &r.value);
                    Line {
                        name: format!("  {}", b.address),
                        state: b.state.name().into(),
                        flows: b.live_flows,
                        pps: rate.map_or(0.0, |r| r.pps),
                        bps: rate.map_or(0.0, |r| r.bps),
                    }
                })
                .collect();
            backends.sort_by(order);
            let flows = backends.iter().filter_map(|b| b.flows).reduce(|a, b| a + b);
            let usable = v
                .backends
                .iter()
                .filter(|b| b.effective_weight > 0.0)
                .count();
            let vip = Line {
                name: v.vip.to_string(),
                state: if v.panic {
                    format!("PANIC {usable}/{}", v.backends.len())
                } else {
                    format!("{usable}/{} in use", v.backends.len())
                },
                flows,
                pps: stats.map_or(0.0, |x| x.value.pps),
                bps: stats.map_or(0.0, |x| x.value.bps),
            };
            (vip, backends)
        })
        .collect();
    vips.sort_by(|a, b| order(&a.0, &b.0));
    vips.into_iter()
        .flat_map(|(v, b)| std::iter::once(v).chain(b))
        .collect()
}

/// The header: totals per second, drops and malformed by reason, peers.
fn header(s: &Snapshot) -> Vec<String> {
    let rate = |kind: &str| -> f64 {
        s.stats
            .counters
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.value.pps)
            .sum()
    };
    let new_flows: f64 = s
        .stats
        .counters
        .iter()
        .filter(|c| c.name == lb_common::Counter::FwdMaglev.name())
        .map(|c| c.value.pps)
        .sum();
    let reasons = |kind: &str| -> String {
        let mut r: Vec<String> = s
            .stats
            .counters
            .iter()
            .filter(|c| c.kind == kind && c.value.packets > 0)
            .map(|c| format!("{} {:.0}/s ({})", c.name, c.value.pps, c.value.packets))
            .collect();
        if r.is_empty() {
            r.push("none".into());
        }
        r.join(", ")
    };
    // Rates are never negative; `+ 0.0` turns -0 into 0.
    let mut out = vec![
        format!(
            "forwarded {:.0} pps  passed {:.0} pps  new flows {:.0}/s  (rates over {:.1} s)",
            rate("forward").max(0.0) + 0.0,
            rate("pass").max(0.0) + 0.0,
            new_flows.max(0.0) + 0.0,
            s.stats.interval_secs
        ),
        format!("drops: {}", reasons("drop")),
        format!(
            "malformed ({}): {}",
            s.stats.malformed_policy,
            reasons("malformed")
        ),
    ];
    let peers: Vec<String> = s
        .bgp
        .peers
        .iter()
        .map(|p| {
            let bfd = p
                .bfd
                .as_ref()
                .map(|b| format!(" bfd {}", b.state))
                .unwrap_or_default();
            format!("{} {:?}{bfd}", p.peer, p.state)
        })
        .collect();
    if !peers.is_empty() {
        out.push(format!("peers: {}", peers.join(", ")));
    }
    out
}

const COLUMNS: [&str; 5] = ["vip / backend", "state", "live flows", "pps", "bps"];

/// The plain snapshot (`--once`, or off a terminal).
fn plain(s: &Snapshot, sort: Sort) -> String {
    let mut out = header(s).join("\n");
    let rows: Vec<[String; 5]> = lines(s, sort, false).iter().map(Line::cells).collect();
    let width = |i: usize| {
        rows.iter()
            .map(|r| r[i].len())
            .chain([COLUMNS[i].len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = (0..5).map(width).collect();
    let row = |cells: [&str; 5]| {
        let mut l = format!(
            "{:<w0$}  {:<w1$}",
            cells[0],
            cells[1],
            w0 = widths[0],
            w1 = widths[1]
        );
        for i in 2..5 {
            l += &format!("  {:>w$}", cells[i], w = widths[i]);
        }
        l.trim_end().to_string()
    };
    out += "\n\n";
    out += &row(COLUMNS
        .map(str::to_uppercase)
        .each_ref()
        .map(String::as_str));
    for r in &rows {
        out += "\n";
        out += &row(r.each_ref().map(String::as_str));
    }
    out
}

pub fn run(socket: &Path, args: TopArgs, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&Snapshot::read(socket)?)?
        );
        return Ok(());
    }
    if args.once || !std::io::stdout().is_terminal() {
        println!("{}", plain(&Snapshot::read(socket)?, args.sort));
        return Ok(());
    }
    // Read once before taking the screen: an unreachable lbd is an error
    // on a normal terminal, not a blank full-screen view.
    let first = Snapshot::read(socket)?;
    let mut terminal = ratatui::init();
    let result = screen(&mut terminal, socket, &args, first);
    ratatui::restore();
    result
}

/// The full-screen loop: draw, take keys until the next refresh is due,
/// refresh.
fn screen(
    terminal: &mut ratatui::DefaultTerminal,
    socket: &Path,
    args: &TopArgs,
    first: Snapshot,
) -> Result<()> {
    let (mut sort, mut reverse) = (args.sort, false);
    let mut snapshot = first;
    let mut error = None;
    let every = Duration::from_secs_f64(args.interval);
    let mut due = Instant::now() + every;
    loop {
        terminal.draw(|f| draw(f, &snapshot, sort, reverse, error.as_deref()))?;
        // Keys do not postpone the refresh: wait only until it is due.
        if event::poll(due.saturating_duration_since(Instant::now()))? {
            if let Event::Key(k) = event::read()?
                && k.kind == KeyEventKind::Press
            {
                match k.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(());
                    }
                    KeyCode::Char('s') => sort = sort.next(),
                    KeyCode::Char('r') => reverse = !reverse,
                    _ => {}
                }
            }
            if Instant::now() < due {
                continue;
            }
        }
        due = Instant::now() + every;
        // lbd restarting: keep the last view and say why it is old.
        match Snapshot::read(socket) {
            Ok(s) => (snapshot, error) = (s, None),
            Err(e) => error = Some(format!("{e:#}")),
        }
    }
}

fn draw(f: &mut ratatui::Frame, s: &Snapshot, sort: Sort, reverse: bool, error: Option<&str>) {
    let mut head = header(s);
    head.push(format!(
        "sorted by {}{}  —  s: sort  r: reverse  q: quit",
        sort.name(),
        if reverse { " (reversed)" } else { "" },
    ));
    let [warning, top, table] = Layout::vertical([
        Constraint::Length(u16::from(error.is_some())),
        Constraint::Length(head.len() as u16 + 1),
        Constraint::Min(0),
    ])
    .areas(f.area());
    if let Some(e) = error {
        // First and in reverse video: the figures below are old.
        let stale = Style::new().fg(Color::Red).add_modifier(Modifier::REVERSED);
        f.render_widget(
            Paragraph::new(format!("STALE, not refreshed: {e}")).style(stale),
            warning,
        );
    }
    f.render_widget(Paragraph::new(head.join("\n")), top);
    let rows = lines(s, sort, reverse)
        .into_iter()
        .map(|l| Row::new(l.cells()));
    let widths = [
        Constraint::Min(28),
        Constraint::Length(16),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(10),
    ];
    let header = Row::new(COLUMNS).style(Style::new().add_modifier(Modifier::BOLD));
    f.render_widget(Table::new(rows, widths).header(header), table);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot() -> Snapshot {
        let stats = serde_json::json!({
            "interval_secs": 1.0,
            "malformed_policy": "pass",
            "counters": [
                {"name": "fwd_maglev_new_flow", "kind": "forward", "packets": 50, "bytes": 0, "pps": 5.0, "bps": 0.0},
                {"name": "fwd_conntrack", "kind": "forward", "packets": 900, "bytes": 0, "pps": 95.0, "bps": 0.0},
                {"name": "drop_no_backend", "kind": "drop", "packets": 3, "bytes": 0, "pps": 0.0, "bps": 0.0},
                {"name": "malformed_ipv4", "kind": "malformed", "packets": 0, "bytes": 0, "pps": 0.0, "bps": 0.0}
            ],
            "vips": [
                {"vip": "10.0.0.1:80/tcp", "packets": 1, "bytes": 1, "pps": 10.0, "bps": 1000.0, "backends": [
                    {"address": "10.1.0.1", "packets": 1, "bytes": 1, "pps": 3.0, "bps": 300.0},
                    {"address": "10.1.0.2", "packets": 1, "bytes": 1, "pps": 7.0, "bps": 700.0}]},
                {"vip": "10.0.0.2:53/udp", "packets": 1, "bytes": 1, "pps": 90.0, "bps": 9000.0, "backends": []}
            ]
        });
        let backend = |a: &str, state: &str, flows: u64| {
            serde_json::json!({"address": a, "state": state, "health": "up", "check": null,
                "weight": 1, "effective_weight": 1.0, "in_state_secs": 1.0, "last_probe": null,
                "probes": 0, "live_flows": flows})
        };
        let health = serde_json::json!([
            {"vip": "10.0.0.1:80/tcp", "panic": false, "panic_entered": 0,
             "backends": [backend("10.1.0.1", "active", 9), backend("10.1.0.2", "draining", 2)]},
            {"vip": "10.0.0.2:53/udp", "panic": true, "panic_entered": 1, "backends": []}
        ]);
        let bgp = serde_json::json!({"node": "serving", "node_state_secs": 0.0, "attached": true,
            "shutdown_grace_secs": 0.0, "announced": [], "announcers": [], "peers": [], "vips": []});
        Snapshot {
            stats: serde_json::from_value(stats).unwrap(),
            health: serde_json::from_value(health).unwrap(),
            bgp: serde_json::from_value(bgp).unwrap(),
        }
    }

    #[test]
    fn lines_put_each_vip_before_its_backends_in_the_chosen_order() {
        let s = snapshot();
        let names = |sort, rev| -> Vec<String> {
            lines(&s, sort, rev).into_iter().map(|l| l.name).collect()
        };
        assert_eq!(
            names(Sort::Pps, false),
            [
                "10.0.0.2:53/udp",
                "10.0.0.1:80/tcp",
                "  10.1.0.2",
                "  10.1.0.1"
            ]
        );
        assert_eq!(
            names(Sort::Flows, false),
            [
                "10.0.0.1:80/tcp",
                "  10.1.0.1",
                "  10.1.0.2",
                "10.0.0.2:53/udp"
            ]
        );
        assert_eq!(
            names(Sort::Pps, true),
            [
                "10.0.0.1:80/tcp",
                "  10.1.0.1",
                "  10.1.0.2",
                "10.0.0.2:53/udp"
            ]
        );
        let web = &lines(&s, Sort::Name, false)[0];
        assert_eq!((web.flows, web.state.as_str()), (Some(11), "2/2 in use"));
        assert_eq!(lines(&s, Sort::Name, false)[3].state, "PANIC 0/0");
    }

    #[test]
    fn the_plain_snapshot_has_totals_reasons_and_a_line_per_backend() {
        let text = plain(&snapshot(), Sort::Pps);
        assert!(text.contains("forwarded 100 pps"), "{text}");
        assert!(text.contains("new flows 5/s"), "{text}");
        assert!(text.contains("drops: drop_no_backend 0/s (3)"), "{text}");
        assert!(text.contains("malformed (pass): none"), "{text}");
        let line = text.lines().find(|l| l.contains("10.1.0.2")).unwrap();
        assert!(
            line.contains("draining") && line.ends_with(" 700"),
            "{line}"
        );
    }
}
