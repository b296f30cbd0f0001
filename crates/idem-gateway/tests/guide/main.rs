//! The user guide (`docs/`) against the code: every problem `type` the workspace emits has
//! its reference page and every page is an emitted type; the settings page says what the
//! declaration of each setting does ([`settings`]); and the built guide has no broken
//! link.

mod settings;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The origin and path every problem `type` URI starts with; the guide is published at
/// that origin's root, so `PROBLEM_PREFIX + slug` is the page `problems/<slug>.html`.
const PROBLEM_PREFIX: &str = "https://idem.dev/problems/";

/// Where the guide is published (its `site-url` is this origin's root).
const SITE: &str = "https://idem.dev/";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every file under `dir` whose name ends with `suffix`, recursively.
fn files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, suffix, out);
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
}

/// The slugs of every `https://idem.dev/problems/<slug>` in the workspace's sources
/// (`crates/*/src`, `examples/*/src`), with a file that names each.
fn emitted_problem_types() -> BTreeMap<String, PathBuf> {
    let mut sources = Vec::new();
    for group in ["crates", "examples"] {
        for entry in std::fs::read_dir(workspace().join(group)).expect("the workspace's members") {
            let src = entry.expect("a directory entry").path().join("src");
            if src.is_dir() {
                files(&src, ".rs", &mut sources);
            }
        }
    }
    let mut slugs = BTreeMap::new();
    for file in sources {
        let text = read(&file);
        for (at, _) in text.match_indices(PROBLEM_PREFIX) {
            let rest = &text[at + PROBLEM_PREFIX.len()..];
            let slug: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
                .collect();
            // `https://idem.dev/problems/<slug>` in prose names the pattern, not a type.
            if !slug.is_empty() {
                slugs.entry(slug).or_insert_with(|| file.clone());
            }
        }
    }
    slugs
}

#[test]
fn every_problem_type_has_its_guide_page_and_every_page_is_an_emitted_type() {
    let emitted = emitted_problem_types();
    // The layer's and the gateway's own kinds, so that a scan that finds nothing fails.
    for known in ["key-reused", "request-in-progress", "upstream-timeout"] {
        assert!(
            emitted.contains_key(known),
            "the scan missed {known}: {emitted:?}"
        );
    }

    let docs = workspace().join("docs");
    let mut pages = BTreeSet::new();
    for entry in std::fs::read_dir(docs.join("src/problems")).expect("docs/src/problems") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(slug) = name.strip_suffix(".md")
            && slug != "index"
        {
            pages.insert(slug.to_owned());
        }
    }

    let missing: Vec<String> = emitted
        .iter()
        .filter(|(slug, _)| !pages.contains(*slug))
        .map(|(slug, file)| format!("{PROBLEM_PREFIX}{slug} (in {})", file.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "problem types without a page in docs/src/problems/<slug>.md: {missing:#?}"
    );
    let unused: Vec<&String> = pages.iter().filter(|p| !emitted.contains_key(*p)).collect();
    assert!(
        unused.is_empty(),
        "pages in docs/src/problems/ for types nothing emits: {unused:?}"
    );

    let summary = read(&docs.join("src/SUMMARY.md"));
    let index = read(&docs.join("src/problems/index.md"));
    for slug in &pages {
        let page = read(&docs.join(format!("src/problems/{slug}.md")));
        assert!(
            page.contains(&format!("`{PROBLEM_PREFIX}{slug}`")),
            "problems/{slug}.md does not name its type URI"
        );
        let link = format!("(problems/{slug}.md)");
        assert!(summary.contains(&link), "SUMMARY.md does not list {link}");
        assert!(
            index.contains(&format!("({slug}.md)")),
            "problems/index.md does not list {slug}"
        );
    }

    // The URI's path is the page's path with `.html` left out only if the guide is
    // served from the origin's root.
    let book = read(&docs.join("book.toml"));
    assert!(
        book.lines().any(|l| l.trim() == r#"site-url = "/""#),
        "docs/book.toml must set site-url = \"/\": the problem URIs are paths from the root"
    );
}

/// The mdbook binary: `IDEM_MDBOOK`, else `mdbook` on the `PATH`.
fn mdbook() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_MDBOOK") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("mdbook"))
        .find(|candidate| candidate.is_file())
}

/// The values of every `name="…"` attribute in `html`.
fn attributes<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let needle = format!(" {name}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every relative link, and every `#anchor`, in the HTML under `root` that names no file
/// or no element there.
fn broken_links(root: &Path) -> Vec<String> {
    let mut pages = Vec::new();
    files(root, ".html", &mut pages);
    let ids: BTreeMap<PathBuf, BTreeSet<String>> = pages
        .iter()
        .map(|page| {
            let html = read(page);
            let ids = attributes(&html, "id")
                .into_iter()
                .map(str::to_owned)
                .collect();
            (lexical(page), ids)
        })
        .collect();
    let mut broken = Vec::new();
    for page in &pages {
        let html = read(page);
        // A `<base href="/">` (the 404 page) makes links relative to the site's root.
        let base = match html.split("<base href=\"").nth(1) {
            Some(rest) => root.join(rest[..rest.find('"').unwrap()].trim_start_matches('/')),
            None => page.parent().unwrap().to_path_buf(),
        };
        let links = attributes(&html, "href")
            .into_iter()
            .chain(attributes(&html, "src"));
        for link in links {
            let external = [
                "http://",
                "https://",
                "mailto:",
                "//",
                "data:",
                "javascript:",
            ]
            .iter()
            .any(|scheme| link.starts_with(scheme));
            if external || link.is_empty() {
                continue;
            }
            let (target, anchor) = match link.split_once('#') {
                Some((target, anchor)) => (target, Some(anchor)),
                None => (link, None),
            };
            let target = target.split('?').next().unwrap();
            let file = if target.is_empty() {
                lexical(page)
            } else if let Some(from_root) = target.strip_prefix('/') {
                lexical(&root.join(from_root))
            } else {
                lexical(&base.join(target))
            };
            let file = if target.ends_with('/') || file.is_dir() {
                file.join("index.html")
            } else {
                file
            };
            let shown = page.strip_prefix(root).unwrap().display();
            if !file.is_file() {
                broken.push(format!("{shown}: {link} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|a| !a.is_empty()) {
                match ids.get(&file) {
                    Some(ids) if ids.contains(anchor) => {}
                    Some(_) => broken.push(format!("{shown}: {link} (no such anchor)")),
                    None => broken.push(format!("{shown}: {link} (an anchor in a non-page)")),
                }
            }
        }
    }
    broken
}

#[test]
fn the_built_guide_has_no_warnings_and_no_broken_links() {
    let Some(mdbook) = mdbook() else {
        let message = "mdbook not found (set IDEM_MDBOOK or put it on PATH): the guide's \
                       links are NOT checked";
        assert!(
            std::env::var_os("IDEM_REQUIRE_SERVICES").is_none_or(|v| v != "1"),
            "{message}, and IDEM_REQUIRE_SERVICES=1 requires them"
        );
        eprintln!("SKIPPED: {message}");
        return;
    };
    let out = tempfile::tempdir().expect("a temporary directory");
    let output = Command::new(&mdbook)
        .arg("build")
        .arg(workspace().join("docs"))
        .arg("--dest-dir")
        .arg(out.path())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", mdbook.display()));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "mdbook build failed:\n{log}");
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "mdbook build warned:\n{log}"
    );
    let mut pages = Vec::new();
    files(out.path(), ".html", &mut pages);
    assert!(pages.len() > 30, "only {} pages built", pages.len());
    let broken = broken_links(out.path());
    assert!(broken.is_empty(), "broken links in the guide: {broken:#?}");

    // The guide is served at the problem URIs' origin: each URI, and each link into the
    // guide from a README, names a built page (`X` served as `X.html`) and its anchor.
    let mut links: Vec<(String, String)> = emitted_problem_types()
        .keys()
        .map(|slug| (format!("{PROBLEM_PREFIX}{slug}"), "the sources".to_owned()))
        .collect();
    let mut readmes = vec![workspace().join("README.md")];
    for entry in std::fs::read_dir(workspace().join("crates")).expect("the crates") {
        let readme = entry.expect("a directory entry").path().join("README.md");
        if readme.is_file() {
            readmes.push(readme);
        }
    }
    for readme in readmes {
        let text = read(&readme);
        for (at, _) in text.match_indices(SITE) {
            let link: String = text[at..]
                .chars()
                .take_while(|c| !matches!(c, ')' | '`' | ' ' | '\n' | '>' | '"'))
                .collect();
            links.push((link, readme.display().to_string()));
        }
    }
    assert!(links.len() > 20, "too few links into the guide: {links:?}");
    let mut unresolved = Vec::new();
    for (link, from) in &links {
        let path = &link[SITE.len()..];
        let (page, anchor) = path.split_once('#').unwrap_or((path, ""));
        let page = if page.is_empty() || page.ends_with('/') {
            format!("{page}index.html")
        } else if page.ends_with(".html") {
            page.to_owned()
        } else {
            format!("{page}.html")
        };
        let file = out.path().join(&page);
        let found = file.is_file()
            && (anchor.is_empty() || attributes(&read(&file), "id").contains(&anchor));
        if !found {
            unresolved.push(format!("{link} (from {from})"));
        }
    }
    assert!(
        unresolved.is_empty(),
        "links that the guide does not resolve: {unresolved:#?}"
    );
}

#[test]
fn the_link_checker_reports_missing_pages_and_anchors_and_nothing_else() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path();
    std::fs::create_dir(root.join("problems")).unwrap();
    std::fs::write(
        root.join("index.html"),
        r##"<h1 id="top">t</h1><a href="#top"></a><a href="problems/a.html#what"></a>
            <a href="problems/"></a><a href="https://example.com/x#y"></a>
            <a href="#nowhere"></a><a href="problems/gone.html"></a>
            <a href="problems/a.html#missing"></a><img src="img.png">"##,
    )
    .unwrap();
    std::fs::write(
        root.join("problems/a.html"),
        r#"<h2 id="what">w</h2><a href="../index.html#top"></a>"#,
    )
    .unwrap();
    std::fs::write(root.join("problems/index.html"), "").unwrap();
    std::fs::write(
        root.join("404.html"),
        r#"<base href="/"><a href="problems/a.html#what"></a><a href="nope.html"></a>"#,
    )
    .unwrap();
    let mut broken = broken_links(root);
    broken.sort();
    assert_eq!(
        broken,
        [
            "404.html: nope.html (no such file)",
            "index.html: #nowhere (no such anchor)",
            "index.html: img.png (no such file)",
            "index.html: problems/a.html#missing (no such anchor)",
            "index.html: problems/gone.html (no such file)",
        ]
    );
}

/// The guide's rows for `idem_requests_total` (the admin page) and the access log's
/// `outcome` field (the logs page) name every outcome the gateway counts.
#[test]
fn the_metrics_and_log_pages_name_every_outcome() {
    for (page, row) in [
        (
            "docs/src/gateway/admin.md",
            "| `idem_requests_total{outcome}` |",
        ),
        ("docs/src/gateway/logs.md", "| `outcome` |"),
    ] {
        let text = read(&workspace().join(page));
        let line = text
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{page} has no row {row}"));
        for outcome in idem_tower::Outcome::ALL {
            assert!(
                line.contains(&format!("`{}`", outcome.as_str())),
                "{page}'s {row} row does not name `{outcome}`"
            );
        }
    }
}

/// Every `SPEC Sn` the workspace's code, tests and docs cite is a section of the
/// guide's contract page (`docs/src/reference/spec.md`, a `## Sn: …` heading each), so
/// a citation resolves for anyone who has the repository; and the page has S1 to its
/// last section with none missing.
#[test]
fn every_cited_spec_section_is_on_the_contract_page() {
    let page = read(&workspace().join("docs/src/reference/spec.md"));
    let sections: BTreeSet<u32> = page
        .lines()
        .filter_map(|l| l.strip_prefix("## S"))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect();
    let last = sections.last().copied().expect("sections on the page");
    assert_eq!(
        sections,
        (1..=last).collect::<BTreeSet<u32>>(),
        "the contract page's sections are S1 to S{last}, each once"
    );
    let mut sources = Vec::new();
    for group in ["crates", "examples"] {
        files(&workspace().join(group), ".rs", &mut sources);
        files(&workspace().join(group), ".md", &mut sources);
    }
    files(&workspace().join("docs/src"), ".md", &mut sources);
    let mut cited = 0;
    let mut missing = Vec::new();
    for file in sources {
        let text = read(&file);
        for (at, _) in text.match_indices("SPEC S") {
            let digits: String = text[at + "SPEC S".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let Ok(n) = digits.parse::<u32>() else {
                continue;
            };
            cited += 1;
            if !sections.contains(&n) {
                missing.push(format!("{}: SPEC S{n}", file.display()));
            }
        }
    }
    assert!(
        cited > 100,
        "only {cited} citations found: is the scan right?"
    );
    assert!(
        missing.is_empty(),
        "cited but not on the page: {missing:#?}"
    );
}

/// The contract and architecture pages name the files that implement and test each
/// part (`crates/idem-tower/src/plan.rs`, or `idem-tower/src/plan.rs` under
/// `crates/`): every one of them exists, so a file moved or renamed is a failing test,
/// not a stale page.
#[test]
fn the_reference_pages_name_files_that_exist() {
    let mut named = 0;
    let mut missing = Vec::new();
    for page in ["spec.md", "architecture.md"] {
        let text = read(&workspace().join("docs/src/reference").join(page));
        for quoted in text.split('`').skip(1).step_by(2) {
            let path = if quoted.starts_with("crates/") || quoted.starts_with("examples/") {
                quoted.to_owned()
            } else if quoted.starts_with("idem-") && quoted.contains('/') {
                format!("crates/{quoted}")
            } else {
                continue;
            };
            // A path with a `::` test name or a glob is not a file name.
            if path.contains(char::is_whitespace) || path.contains("::") || path.contains('*') {
                continue;
            }
            named += 1;
            if !workspace().join(&path).exists() {
                missing.push(format!("{page}: {path}"));
            }
        }
    }
    assert!(named > 50, "only {named} paths found: is the scan right?");
    assert!(
        missing.is_empty(),
        "named but not in the tree: {missing:#?}"
    );
}
