//! A search's progress on the terminal, in both of its currencies (rollouts and screened task evaluations), with
//! a time estimate of the whole command: what is left of the search, its held-out comparison, and later runs.
//!
//! The estimate is measured, not assumed: a search stops on whichever budget runs out first, so the share of
//! the search done is the larger of its two budget fractions, and the search's remaining time is its own pace
//! (reflection included) carried over that share. The held-out comparison is priced from the measured cost of
//! a held-out task (else of a rollout), and a later run (the demo's second objective) is priced as this one.
//! A rollout-only estimate said 37 minutes left when 65 were: screens and reflection were not in it.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tooltune_core::text::one_line;
use tooltune_driver::{Event, Phase};

/// A search's limits in both currencies (`None`: no limit of that kind).
#[derive(Debug, Clone, Copy, Default)]
pub struct Budgets {
    /// Rollouts of the search.
    pub rollouts: Option<u64>,
    /// Screened task evaluations of the search.
    pub screened: Option<u64>,
}

impl Budgets {
    /// Share of the search done at these counts: the larger of the two budget fractions (the search stops on
    /// whichever is spent first), capped at 1. `None` without any budget.
    pub fn fraction(&self, rollouts: u64, screened: u64) -> Option<f64> {
        let of =
            |spent: u64, max: Option<u64>| max.filter(|m| *m > 0).map(|m| spent as f64 / m as f64);
        match (of(rollouts, self.rollouts), of(screened, self.screened)) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0).max(b.unwrap_or(0.0)).min(1.0)),
        }
    }
}

/// Measured costs, shared by the runs of one command (the demo's second run starts from the first's pace).
#[derive(Debug, Clone, Default)]
pub struct Pace {
    /// Seconds spent in rollout evaluations of a search, and the task plays they held.
    rollout_s: f64,
    rollouts: u64,
    /// Seconds spent in held-out evaluations, and their tasks.
    held_out_s: f64,
    held_out_tasks: u64,
}

impl Pace {
    /// Seconds per held-out task: measured on held-out evaluations when there were some, else a rollout's.
    fn per_held_out_task(&self) -> Option<f64> {
        if self.held_out_tasks > 0 && self.held_out_s > 0.0 {
            Some(self.held_out_s / self.held_out_tasks as f64)
        } else if self.rollouts > 0 {
            Some(self.rollout_s / self.rollouts as f64)
        } else {
            None
        }
    }
}

/// Where a run is, for [`seconds_left`].
#[derive(Debug, Clone, Copy)]
pub enum Stage {
    /// Searching: this process has searched for `elapsed_s` and moved the search from `start` to `now` of its
    /// budgets (fractions from [`Budgets::fraction`]).
    Search {
        elapsed_s: f64,
        start: f64,
        now: f64,
    },
    /// The held-out comparison: the search took `search_s`; `done` held-out evaluations have finished.
    HeldOut { search_s: f64, done: u64 },
}

/// Seconds the command still needs: the rest of this run's search, its held-out evaluations of the seed and the
/// winner (`test_tasks` each), and `later_runs` whole runs priced as this one. `None` before there is a pace.
pub fn seconds_left(stage: Stage, pace: &Pace, test_tasks: u64, later_runs: u64) -> Option<f64> {
    let per_task = pace.per_held_out_task();
    let held_out = |done: u64| -> Option<f64> {
        let left = (2 * test_tasks).saturating_sub(done * test_tasks);
        if left == 0 {
            return Some(0.0);
        }
        per_task.map(|p| p * left as f64)
    };
    let (search_left, search_total, held_out_left) = match stage {
        Stage::Search {
            elapsed_s,
            start,
            now,
        } => {
            let done_here = now - start;
            if done_here <= 0.0 || elapsed_s <= 0.0 {
                return None;
            }
            let left = elapsed_s / done_here * (1.0 - now).max(0.0);
            // A whole run's search from zero, at this pace, for the runs after this one.
            (left, elapsed_s / done_here, held_out(0)?)
        }
        Stage::HeldOut { search_s, done } => (0.0, search_s, held_out(done)?),
    };
    let later = if later_runs > 0 {
        later_runs as f64 * (search_total + held_out(0)?)
    } else {
        0.0
    };
    Some(search_left + held_out_left + later)
}

/// ", about N min left", or nothing without an estimate.
pub fn left_text(s: Option<f64>) -> String {
    match s {
        None => String::new(),
        Some(s) if s < 90.0 => format!(", about {s:.0} s left"),
        Some(s) => format!(", about {:.0} min left", s / 60.0),
    }
}

/// What the events have said so far.
struct Seen {
    rollouts: u64,
    screened: u64,
    /// Budget fraction when this process started (a resumed run had spent some).
    start_fraction: f64,
    /// The evaluation in flight: its phase, tasks and start.
    current: Option<(Phase, usize, Instant)>,
    /// When the search stopped (the held-out comparison follows).
    search_s: Option<f64>,
    held_out_done: u64,
    /// The reflector's replies seen by this process, and how many gave a description.
    replies: u32,
    usable: u32,
}

/// A progress display fed by the driver's events. `spent_before` is what a resumed run had already spent
/// (rollouts, screened): the pace is of this process's work only. `pace` carries measured costs from one run
/// of a command to the next.
pub fn printer(
    label: String,
    budgets: Budgets,
    spent_before: (u64, u64),
    test_tasks: u64,
    later_runs: u64,
    pace: Arc<Mutex<Pace>>,
) -> (ProgressBar, impl Fn(&Event) + Send + Sync) {
    // Positions are thousandths of the search (whichever budget binds), so a search on screens alone moves too.
    let bar = ProgressBar::new(1000);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] ({elapsed}) {msg}")
            .unwrap_or(ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.clone());
    let b = bar.clone();
    // Without a terminal (CI logs, a pipe) the bar draws nothing and its `println` is dropped too: progress
    // then goes to stderr as plain lines, so a long run is never silent.
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let start_fraction = budgets
        .fraction(spent_before.0, spent_before.1)
        .unwrap_or(0.0);
    let seen = Mutex::new(Seen {
        rollouts: spent_before.0,
        screened: spent_before.1,
        start_fraction,
        current: None,
        search_s: None,
        held_out_done: 0,
        replies: 0,
        usable: 0,
    });
    let spent_text = move |r: u64, s: u64| {
        let mut parts = vec![match budgets.rollouts {
            Some(m) => format!("{r}/{m} rollouts"),
            None => format!("{r} rollouts"),
        }];
        if let Some(m) = budgets.screened {
            parts.push(format!("{s}/{m} screened"));
        } else if s > 0 {
            parts.push(format!("{s} screened"));
        }
        parts.join(", ")
    };
    let estimate = move |seen: &Seen, pace: &Pace| -> String {
        let stage = match seen.search_s {
            Some(search_s) => Stage::HeldOut {
                search_s,
                done: seen.held_out_done,
            },
            None => {
                let Some(now) = budgets.fraction(seen.rollouts, seen.screened) else {
                    // A search without any budget has no end to estimate.
                    return String::new();
                };
                Stage::Search {
                    elapsed_s: started.elapsed().as_secs_f64(),
                    start: seen.start_fraction,
                    now,
                }
            }
        };
        left_text(seconds_left(stage, pace, test_tasks, later_runs))
    };
    let say = move |b: &ProgressBar, line: String| {
        if tty {
            b.println(line);
        } else {
            eprintln!(
                "[{:>5.0}s {label}] {}",
                started.elapsed().as_secs_f64(),
                line.trim_start()
            );
        }
    };
    // A status line: the bar's message, and a plain line too without a terminal.
    let status = move |b: &ProgressBar, m: String, say: &dyn Fn(&ProgressBar, String)| {
        if !tty {
            say(b, m.clone());
        }
        b.set_message(m);
    };
    let f = move |e: &Event| {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        match e {
            Event::Evaluating {
                candidate,
                phase,
                tasks,
            } => {
                seen.current = Some((*phase, *tasks, Instant::now()));
                let left = if *phase == Phase::Test {
                    let pace = pace.lock().unwrap_or_else(|p| p.into_inner());
                    estimate(&seen, &pace)
                } else {
                    String::new()
                };
                status(
                    &b,
                    format!("evaluating c{candidate} on {tasks} {phase} tasks{left}"),
                    &say,
                );
            }
            Event::Evaluated {
                candidate,
                phase,
                mean,
                rollouts_spent,
                screened_spent,
                ..
            } => {
                let mut pace = pace.lock().unwrap_or_else(|p| p.into_inner());
                if let Some((p, n, t0)) = seen.current.take()
                    && p == *phase
                {
                    let s = t0.elapsed().as_secs_f64();
                    if *phase == Phase::Test {
                        pace.held_out_s += s;
                        pace.held_out_tasks += n as u64;
                    } else if !phase.is_screen() {
                        pace.rollout_s += s;
                        pace.rollouts += n as u64;
                    }
                }
                if *phase == Phase::Test {
                    seen.held_out_done += 1;
                } else {
                    seen.rollouts = *rollouts_spent;
                    seen.screened = *screened_spent;
                    if let Some(f) = budgets.fraction(seen.rollouts, seen.screened) {
                        b.set_position((f * 1000.0) as u64);
                    }
                }
                let spent = spent_text(seen.rollouts, seen.screened);
                let left = estimate(&seen, &pace);
                say(
                    &b,
                    format!("  c{candidate} {phase}: mean {mean:.3} ({spent}{left})"),
                );
            }
            Event::Reflecting { parent, tool } => {
                status(&b, format!("reflecting on c{parent}'s `{tool}`"), &say);
            }
            Event::Proposed {
                tool,
                description,
                error,
                ..
            } => {
                seen.replies += 1;
                seen.usable += u32::from(description.is_some());
                let tally = format!("{} of {} usable", seen.usable, seen.replies);
                match description {
                    Some(d) => say(
                        &b,
                        format!("  proposed for `{tool}` ({tally}): {}", one_line(d, 100)),
                    ),
                    None => say(
                        &b,
                        format!(
                            "  proposal for `{tool}` failed ({tally}): {}",
                            error.as_deref().unwrap_or("?")
                        ),
                    ),
                }
            }
            Event::Stopped { reason } => {
                seen.search_s = Some(started.elapsed().as_secs_f64());
                status(
                    &b,
                    format!("stopped ({reason}); final test evaluation"),
                    &say,
                );
            }
            _ => {}
        }
    };
    (bar, f)
}

/// Ctrl-C, listened for from the moment `listen` returns.
///
/// `tokio::signal::ctrl_c()` registers its handler only when first polled, so a SIGINT that arrives between a
/// command announcing itself (its URL, its first progress line) and that poll is lost when the process inherited
/// SIGINT *ignored*, as a background job of a shell without job control does: a script that reads the URL and
/// sends SIGINT at once then leaves the command running. Every long-running command listens before it announces.
pub struct Interrupts {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Interrupts {
    /// Starts listening (needs a tokio runtime).
    pub fn listen() -> std::io::Result<Interrupts> {
        Ok(Interrupts {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?,
        })
    }

    /// Waits for the next Ctrl-C; `false` if no more can arrive.
    pub async fn next(&mut self) -> bool {
        #[cfg(unix)]
        {
            self.signal.recv().await.is_some()
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await.is_ok()
        }
    }
}

/// Ctrl-C stops `stop` after the current step (the run stays resumable); a second Ctrl-C ends the process at once,
/// for when the step itself does not end (a run with workers waits on jobs no worker takes, a model that hangs).
/// What was stored before stays stored, and the run resumes from its last checkpoint. Listening starts before this
/// returns (see [`Interrupts`]).
pub fn stop_on_ctrl_c(stop: tooltune_driver::StopSignal) -> std::io::Result<()> {
    let mut interrupts = Interrupts::listen()?;
    tokio::spawn(async move {
        if !interrupts.next().await {
            return;
        }
        stop.stop();
        eprintln!(
            "stopping after the current step (Ctrl-C again to quit now; the run can be resumed)"
        );
        if interrupts.next().await {
            eprintln!(
                "quitting: what was stored stays, and the run resumes from its last checkpoint"
            );
            std::process::exit(130);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_budget_decides_the_share_of_the_search_done() {
        let b = Budgets {
            rollouts: Some(70),
            screened: Some(300),
        };
        assert_eq!(b.fraction(35, 30), Some(0.5));
        assert_eq!(b.fraction(0, 150), Some(0.5), "a search on screens alone");
        assert_eq!(b.fraction(80, 0), Some(1.0), "an overshoot is capped");
        assert_eq!(Budgets::default().fraction(5, 5), None);
        let rollouts_only = Budgets {
            rollouts: Some(10),
            screened: None,
        };
        assert_eq!(rollouts_only.fraction(5, 999), Some(0.5));
    }

    #[test]
    fn the_estimate_covers_the_search_the_held_out_comparison_and_later_runs() {
        let pace = Pace {
            rollout_s: 80.0,
            rollouts: 10,
            ..Pace::default()
        };
        // A quarter of the search in 100 s: 300 s to go, then 2 x 40 held-out tasks at 8 s.
        let search = Stage::Search {
            elapsed_s: 100.0,
            start: 0.0,
            now: 0.25,
        };
        assert_eq!(seconds_left(search, &pace, 40, 0), Some(300.0 + 640.0));
        // One later run: a whole search (400 s) and its held-out comparison again.
        assert_eq!(
            seconds_left(search, &pace, 40, 1),
            Some(300.0 + 640.0 + 400.0 + 640.0)
        );
        // A resumed run that started at half: its pace is of its own share only.
        let resumed = Stage::Search {
            elapsed_s: 100.0,
            start: 0.5,
            now: 0.75,
        };
        assert_eq!(seconds_left(resumed, &pace, 0, 0), Some(100.0));
        // Held-out tasks measured as cheaper than rollouts (a cached seed): their own pace wins.
        let measured = Pace {
            held_out_s: 40.0,
            held_out_tasks: 40,
            ..pace.clone()
        };
        let held = Stage::HeldOut {
            search_s: 400.0,
            done: 1,
        };
        assert_eq!(seconds_left(held, &measured, 40, 0), Some(40.0));
        assert_eq!(
            seconds_left(held, &measured, 40, 1),
            Some(40.0 + 400.0 + 80.0)
        );
    }

    #[test]
    fn there_is_no_estimate_without_a_pace() {
        let none = Pace::default();
        let search = Stage::Search {
            elapsed_s: 100.0,
            start: 0.0,
            now: 0.0,
        };
        assert_eq!(seconds_left(search, &none, 40, 0), None, "nothing done yet");
        let half = Stage::Search {
            elapsed_s: 100.0,
            start: 0.0,
            now: 0.5,
        };
        assert_eq!(
            seconds_left(half, &none, 40, 0),
            None,
            "no rollout to price the held-out tasks"
        );
        assert_eq!(seconds_left(half, &none, 0, 0), Some(100.0));
        assert_eq!(left_text(Some(40.0)), ", about 40 s left");
        assert_eq!(left_text(Some(540.0)), ", about 9 min left");
        assert_eq!(left_text(None), "");
    }
}
