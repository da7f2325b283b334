//! What each request does: `route` sends a GET to a report (`status`, `metrics`, the
//! event ring, the index) and a POST on the Unix socket to `command`, which parses the
//! query of an operator command and hands it to `jobs.rs`.

use super::http::Response;
use super::{metrics, status, State, SCHEMA};
use serde_json::json;
use std::path::PathBuf;
use uraid_core::http::Head;

/// `key=value` pairs of a query string (`uraid_core::http::query_pairs`); 400 otherwise.
fn query<'a>(q: &'a str, known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, Response> {
    uraid_core::http::query_pairs(q, known).map_err(|e| Response::error(400, &e))
}

/// The `member=N` parameter of a command (required).
fn member_param(q: &[(&str, &str)]) -> Result<usize, Response> {
    match q
        .iter()
        .find(|x| x.0 == "member")
        .map(|x| x.1.parse::<usize>())
    {
        Some(Ok(m)) => Ok(m),
        _ => Err(Response::error(400, "member=N is required")),
    }
}

/// The `path=DEVICE` parameter of a command (required, percent-encoded).
fn path_param(q: &[(&str, &str)]) -> Result<PathBuf, Response> {
    match q
        .iter()
        .find(|x| x.0 == "path")
        .map(|x| uraid_core::http::percent_decode(x.1))
    {
        Some(Some(p)) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => Err(Response::error(
            400,
            "path=DEVICE (percent-encoded) is required",
        )),
    }
}

/// The `force` parameter of a command: absent or 0, or 1.
fn force_param(q: &[(&str, &str)]) -> Result<bool, Response> {
    match q.iter().find(|x| x.0 == "force").map(|x| x.1) {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(Response::error(400, &format!("force={v}: 0 or 1"))),
    }
}

/// `t` with the parameters of `POST /throttle` applied: budget (stripes), min and max (MB/s
/// of member I/O), priority (low, normal, high).
fn throttle_params(
    mut t: uraid_engine::Throttle,
    q: &[(&str, &str)],
) -> Result<uraid_engine::Throttle, Response> {
    if q.is_empty() {
        return Err(Response::error(
            400,
            "nothing to set: budget=STRIPES, min=MB/S, max=MB/S or priority=low|normal|high",
        ));
    }
    let number = |k: &str, v: &str, max: u64| match v.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(Response::error(
            400,
            &format!("{k}={v}: a whole number from 0 to {max}"),
        )),
    };
    for &(k, v) in q {
        match k {
            "budget" => t.budget = number(k, v, 1 << 16)? as usize,
            "min" => t.min_bytes_per_second = number(k, v, 1 << 30)? << 20,
            "max" => t.max_bytes_per_second = number(k, v, 1 << 30)? << 20,
            _ => {
                t.priority = uraid_engine::Priority::parse(v).ok_or_else(|| {
                    Response::error(400, &format!("priority={v}: low, normal or high"))
                })?
            }
        }
    }
    Ok(t)
}

/// The throttle as an operator reads it.
fn throttle_words(t: &uraid_engine::Throttle) -> String {
    let rate = |b: u64| {
        if b == 0 {
            "unlimited".to_string()
        } else {
            format!("{} MB/s", b >> 20)
        }
    };
    format!(
        "budget {} stripe(s) while clients are active{}, priority {}, min {}, max {}",
        t.budget,
        if t.budget == 0 {
            " (off: min rate)"
        } else {
            ""
        },
        t.priority.name(),
        rate(t.min_bytes_per_second),
        rate(t.max_bytes_per_second)
    )
}

/// An operator command (`POST`, Unix socket only): 202 with a message, or the refusal.
fn command(state: &State, h: &Head) -> Response {
    match run_command(state, h) {
        Ok(Ok(msg)) => Response::json(202, &json!({ "ok": true, "message": msg })),
        // Refusals name the CLI's flags; a client of the socket itself passes force=1.
        Ok(Err((status, msg))) if msg.contains("--force") => {
            Response::error(status, &format!("{msg}{}", super::FORCE_HINT))
        }
        Ok(Err((status, msg))) => Response::error(status, &msg),
        Err(r) => r,
    }
}

/// A command's outcome (the job's message or refusal), or the response to a request that
/// names no command or gives bad parameters.
type Outcome = Result<Result<String, crate::jobs::Refusal>, Response>;

fn run_command(state: &State, h: &Head) -> Outcome {
    let jobs = &state.jobs;
    Ok(match h.path.as_str() {
        "/scrub" => {
            let q = query(&h.query, &["mode"])?;
            let mode = match q.first().map(|x| x.1) {
                None | Some("check") => uraid_engine::ScrubMode::Check,
                Some("repair") => uraid_engine::ScrubMode::Repair,
                Some(m) => {
                    return Err(Response::error(
                        400,
                        &format!("mode {m:?}: check or repair"),
                    ))
                }
            };
            jobs.start_scrub(mode)
        }
        "/scrub/pause" | "/scrub/resume" | "/scrub/cancel" => {
            no_params(h)?;
            jobs.scrub_command(&h.path["/scrub/".len()..])
        }
        "/add" => {
            let q = query(&h.query, &["path", "force"])?;
            let path = path_param(&q)?;
            jobs.add(&path, force_param(&q)?)
        }
        "/fail" => {
            let q = query(&h.query, &["member", "force"])?;
            let member = member_param(&q)?;
            jobs.fail(member, force_param(&q)?)
        }
        "/replace" => {
            let q = query(&h.query, &["member", "path", "force"])?;
            let member = member_param(&q)?;
            let path = path_param(&q)?;
            jobs.replace(member, &path, force_param(&q)?)
        }
        "/replace/cancel" => {
            let q = query(&h.query, &["member"])?;
            let member = match q.iter().find(|x| x.0 == "member") {
                Some(_) => Some(member_param(&q)?),
                None => None,
            };
            jobs.replace_cancel(member)
        }
        "/remove" => {
            let q = query(&h.query, &["member", "path", "force"])?;
            let force = force_param(&q)?;
            jobs.remove(removal_param(&q)?, force)
        }
        "/throttle" => {
            let q = query(&h.query, &["budget", "min", "max", "priority"])?;
            let t = throttle_params(state.volume.array().throttle(), &q)?;
            state.volume.array().set_throttle(t);
            tracing::info!(
                target: "uraid_engine::recovery",
                "throttle set: {}",
                throttle_words(&t)
            );
            Ok(format!("throttle: {}", throttle_words(&t)))
        }
        "/tls/reload" => {
            no_params(h)?;
            match state.server.reload_tls() {
                Ok(what) => {
                    tracing::info!(target: "uraid::serve", "TLS credentials reloaded: {what}");
                    Ok(format!("TLS credentials reloaded: {what}"))
                }
                Err(e) => Err((409, format!("TLS credentials not reloaded: {e}"))),
            }
        }
        "/status" | "/metrics" | "/events" | "/" => {
            return Err(Response::error(
                405,
                "a report: GET it (POST is for commands)",
            ))
        }
        _ => return Err(Response::error(404, "no such command")),
    })
}

/// A command that takes no parameters: 400 when it is given some.
fn no_params(h: &Head) -> Result<(), Response> {
    if h.query.is_empty() {
        Ok(())
    } else {
        Err(Response::error(400, "no parameters"))
    }
}

/// What `POST /remove` removes: `member=N` or `path=SPARE` (one of them).
fn removal_param(q: &[(&str, &str)]) -> Result<crate::jobs::Removal, Response> {
    let member = q.iter().find(|x| x.0 == "member").map(|x| x.1);
    let path = q.iter().find(|x| x.0 == "path").map(|x| x.1);
    match (member, path) {
        (Some(m), None) => match m.parse::<usize>() {
            Ok(m) => Ok(crate::jobs::Removal::Member(m)),
            Err(_) => Err(Response::error(400, &format!("member={m}: a number"))),
        },
        (None, Some(p)) => match uraid_core::http::percent_decode(p) {
            Some(p) if !p.is_empty() => Ok(crate::jobs::Removal::Spare(PathBuf::from(p))),
            _ => Err(Response::error(400, "path=SPARE (percent-encoded)")),
        },
        _ => Err(Response::error(400, "member=N or path=SPARE (one of them)")),
    }
}

/// The response to one request; `metrics_only` for the TCP listener.
pub(super) fn route(state: &State, h: &Head, metrics_only: bool) -> Response {
    if h.method == "POST" && !metrics_only {
        return command(state, h);
    }
    if h.method != "GET" {
        return Response::error(
            405,
            if metrics_only {
                "this listener serves GET /metrics only"
            } else {
                "GET and POST only"
            },
        );
    }
    if metrics_only && h.path != "/metrics" {
        return Response::error(
            404,
            "this listener serves /metrics only; the rest is on the control socket",
        );
    }
    match h.path.as_str() {
        "/status" => Response::json(200, &status::status(state)),
        "/metrics" => Response {
            status: 200,
            content_type: "text/plain; version=0.0.4; charset=utf-8",
            body: metrics::metrics(state),
        },
        "/events" => {
            let mut since = 0u64;
            for kv in h.query.split('&').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("since", v)) => match v.parse() {
                        Ok(n) => since = n,
                        Err(_) => return Response::error(400, "since: expected a number"),
                    },
                    _ => return Response::error(400, &format!("unknown parameter {kv:?}")),
                }
            }
            Response::json(
                200,
                &json!({ "schema": SCHEMA, "events": state.events.since(since) }),
            )
        }
        "/" => Response::json(
            200,
            &json!({
                "endpoints": ["/status", "/metrics", "/events?since=N"],
                "commands": [
                    "POST /scrub?mode=check|repair", "POST /scrub/pause", "POST /scrub/resume",
                    "POST /scrub/cancel", "POST /fail?member=N&force=0|1",
                    "POST /add?path=DEVICE&force=0|1",
                    "POST /remove?member=N&force=0|1", "POST /remove?path=SPARE",
                    "POST /replace?member=N&path=DEVICE&force=0|1", "POST /replace/cancel[?member=N]",
                    "POST /throttle?budget=STRIPES&min=MB/S&max=MB/S&priority=low|normal|high"
                ],
            }),
        ),
        _ => Response::error(404, "no such endpoint"),
    }
}
