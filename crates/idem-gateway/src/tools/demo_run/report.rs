//! What a run shows: the charges attributed to their operations, and the side-by-side
//! text table.

use serde_json::Value;

use super::children::Children;

/// The charges of one side, attributed: how many each operation got.
#[derive(Debug)]
pub(super) struct Charged {
    pub(super) per_operation: Vec<u64>,
}

impl Charged {
    pub(super) fn charges(&self) -> u64 {
        self.per_operation.iter().sum()
    }
    pub(super) fn double(&self) -> u64 {
        self.per_operation.iter().filter(|&&n| n > 1).count() as u64
    }
    pub(super) fn uncharged(&self) -> u64 {
        self.per_operation.iter().filter(|&&n| n == 0).count() as u64
    }
}

/// How many charges of `charges` each operation of `side` in `run` got.
pub(super) fn attribute(charges: &Value, run: &str, side: &str, n: u32) -> Charged {
    let mut per_operation = vec![0u64; n as usize];
    let list = charges["charges"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for c in list {
        let m = &c["metadata"];
        if m["demo"] == run
            && m["side"] == side
            && let Some(slot) = m["operation"]
                .as_u64()
                .and_then(|op| per_operation.get_mut(op as usize))
        {
            *slot += 1;
        }
    }
    Charged { per_operation }
}

/// `1234567` as `1 234 567`.
pub(super) fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

/// The side-by-side table, the summary line and, with `--keep`, what was left running.
pub(super) fn text_report(r: &Value, keep: bool, children: &Children) -> String {
    let n = r["operations"].as_u64().unwrap_or_default();
    let f = &r["faults"];
    let num = |v: &Value| grouped(v.as_u64().unwrap_or_default());
    let mut out = format!(
        "idem demo: {} payments to the demo payments API, straight and through idem serve ({})\n\
         faults on both: {} answers lost, {} client timeouts, {} duplicated sends, \
         the gateway killed (kill -9) and restarted halfway\n\n",
        grouped(n),
        r["store"].as_str().unwrap_or_default(),
        num(&f["answers_lost"]),
        num(&f["client_timeouts"]),
        num(&f["duplicated_sends"]),
    );
    let (wo, wi) = (&r["without_idem"], &r["with_idem"]);
    out.push_str(&format!(
        "{:<32}{:>14}{:>12}\n",
        "", "without idem", "with idem"
    ));
    for (label, field) in [
        ("operations answered", "answered"),
        ("charges made", "charges"),
        ("operations charged twice+", "double_charged"),
        ("operations not charged", "uncharged"),
        ("answers the client got", "answers"),
        ("  of them replays", "replays"),
        ("  of them 409 (in progress)", "conflicts"),
        ("attempts left without answer", "unanswered_attempts"),
    ] {
        out.push_str(&format!(
            "{label:<32}{:>14}{:>12}\n",
            num(&wo[field]),
            num(&wi[field])
        ));
    }
    out.push_str(&format!(
        "\n{} operations: {} charges without idem, {} with idem, {} double ({}s)\n",
        grouped(n),
        num(&wo["charges"]),
        num(&wi["charges"]),
        num(&wi["double_charged"]),
        r["seconds"]
    ));
    if keep {
        let api = r["api"]["url"].as_str().unwrap_or_default();
        let gateway = r["gateway"]["url"].as_str().unwrap_or_default();
        let pids: Vec<String> = [&children.api, &children.gateway]
            .into_iter()
            .flatten()
            .map(|c| c.id().to_string())
            .collect();
        out.push_str(&format!(
            "\nLeft running (--keep):\n  demo API       {api}  (pid {})\n  idem gateway   {gateway}  (pid {}, store {})\n  files and logs {}\n\
             Try: curl -s {api}/v1/charges\n     curl -si {gateway}/v1/charges -H 'Idempotency-Key: k1' -H 'Content-Type: application/json' -d '{{\"amount\":1200,\"currency\":\"eur\"}}'\n\
             Stop them with: kill {} && rm -r {}\n",
            pids.first().map_or("?", |p| p.as_str()),
            pids.get(1).map_or("?", |p| p.as_str()),
            r["store"].as_str().unwrap_or_default(),
            children.dir.display(),
            pids.join(" "),
            children.dir.display(),
        ));
    }
    out
}
