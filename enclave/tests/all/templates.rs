//! Real models' chat templates, rendered by `veil_enclave::text::template`,
//! against Python jinja2 in Hugging Face's `apply_chat_template` setup.
//!
//! The templates are llama.cpp's reference set, read from
//! `$VEIL_LLAMACPP_REF/templates` or `../shared/llamacpp-reference/templates`
//! beside the workspace (never copied into the repository); absent, the test
//! prints SKIP, unless `VEIL_REQUIRE_LLAMACPP_REF=1`. jinja2's output per
//! template is `testdata/chat_template_fixtures.json`
//! (`scripts/reference/gen_template_fixtures.py`) for two conversations,
//! pinned to each template by sha256. Every render must equal jinja2's text
//! byte for byte;
//! where jinja2 fails, we must fail too (a `raise_exception` with the same
//! message); a refusal for a missing feature is allowed only where
//! [`EXPECTED_REFUSALS`] lists it with its reason.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use veil_enclave::text::template::{render, ChatMessage, RenderRequest, TemplateError};

/// Renders we refuse for a feature we lack (template, conversation), with
/// why that is acceptable.
const EXPECTED_REFUSALS: &[(&str, &str, &str)] = &[(
    "meetkai-functionary-medium-v3.1.jinja",
    "tools",
    "its tool section adds strings to `|safe` ones, which jinja2 HTML-escapes (`&#34;` in the definitions): \
     refused by name rather than rendered without the escapes",
)];

/// The fixture's `now` (2025-01-15T10:30:45), as seconds since the epoch.
const FIXTURE_NOW_SECS: u64 = 1_736_937_045;

#[derive(serde::Deserialize)]
struct Fixtures {
    now: String,
    templates: Vec<Fixture>,
}

#[derive(serde::Deserialize)]
struct Fixture {
    template: String,
    sha256: String,
    cases: Vec<Case>,
}

/// One conversation rendered with one template.
#[derive(Clone, serde::Deserialize)]
struct Case {
    conversation: String,
    context: Context,
    rendered: Option<String>,
    error: Option<String>,
}

#[derive(Clone, serde::Deserialize)]
struct Context {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    bos_token: String,
    eos_token: String,
    tools: Option<serde_json::Value>,
    documents: Option<serde_json::Value>,
}

/// A message as HF receives it; an assistant's tool-call message has no
/// `content`.
#[derive(Clone, serde::Deserialize)]
struct Message {
    role: String,
    content: Option<String>,
    tool_calls: Option<serde_json::Value>,
    tool_call_id: Option<String>,
    name: Option<String>,
}

fn templates_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("VEIL_LLAMACPP_REF")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/llamacpp-reference")]);
    for c in candidates {
        let dir = c.join("templates");
        if dir.is_dir() {
            return Some(dir);
        }
    }
    assert!(
        std::env::var("VEIL_REQUIRE_LLAMACPP_REF").as_deref() != Ok("1"),
        "VEIL_REQUIRE_LLAMACPP_REF=1 but no templates at $VEIL_LLAMACPP_REF/templates or ../shared/llamacpp-reference/templates"
    );
    None
}

/// Where two texts first differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let around = |s: &str| {
        let mut start = at.saturating_sub(40).min(s.len());
        while !s.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = (at + 40).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        format!("{:?}", &s[start..end])
    };
    format!("at byte {at}: ours {} / jinja2 {}", around(a), around(b))
}

/// What happened to one template.
enum Outcome {
    Equal,
    BothFail(String),
    Refused(String),
}

fn check(template: &str, case: &Case, source: &str) -> Result<Outcome, String> {
    let ctx = &case.context;
    if ctx.documents.is_some() {
        return Err("the fixture passes documents; the renderer passes None".into());
    }
    let messages: Vec<ChatMessage> = ctx
        .messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: m.content.clone().unwrap_or_default(),
            tool_calls: m.tool_calls.clone(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
        })
        .collect();
    let request = RenderRequest {
        messages: &messages,
        add_generation_prompt: ctx.add_generation_prompt,
        bos_token: &ctx.bos_token,
        eos_token: &ctx.eos_token,
        tools: ctx.tools.as_ref(),
        now: UNIX_EPOCH + Duration::from_secs(FIXTURE_NOW_SECS),
        extra: None,
    };
    let ours = render(source, &request);
    match (&case.rendered, &case.error, ours) {
        (Some(want), None, Ok(got)) if &got == want => Ok(Outcome::Equal),
        (Some(want), None, Ok(got)) => Err(format!("text differs {}", first_difference(&got, want))),
        (Some(_), None, Err(TemplateError::Unsupported { feature })) => {
            match EXPECTED_REFUSALS.iter().find(|(name, conv, _)| *name == template && *conv == case.conversation) {
                Some((_, _, why)) => Ok(Outcome::Refused(format!("{feature} ({why})"))),
                None => Err(format!("refused ({feature}) but jinja2 renders it")),
            }
        }
        (Some(_), None, Err(e)) => Err(format!("failed ({e}) but jinja2 renders it")),
        (None, Some(jinja), Ok(_)) => Err(format!("rendered, but jinja2 fails: {jinja}")),
        (None, Some(jinja), Err(e)) => {
            // The template's own refusal must say the same thing.
            if let Some(message) = jinja.strip_prefix("TemplateError: ") {
                if !matches!(&e, TemplateError::Raised(m) if m == message) {
                    return Err(format!("jinja2 raises {message:?}, we fail with {e}"));
                }
            }
            Ok(Outcome::BothFail(jinja.clone()))
        }
        _ => Err("fixture has neither or both of rendered/error".into()),
    }
}

#[test]
fn real_templates_render_as_jinja2_does() {
    let Some(dir) = templates_dir() else {
        veil_tests::skip("llama.cpp reference templates not found (set VEIL_LLAMACPP_REF)");
        return;
    };
    let fixtures: Fixtures =
        serde_json::from_str(include_str!("../../testdata/chat_template_fixtures.json")).expect("fixture JSON");
    assert_eq!(fixtures.now, "2025-01-15T10:30:45", "the fixture's clock is FIXTURE_NOW_SECS");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .expect("templates dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jinja"))
        .collect();
    on_disk.sort();
    let in_fixture: Vec<String> = fixtures.templates.iter().map(|f| f.template.clone()).collect();
    assert_eq!(on_disk, in_fixture, "the fixture covers exactly the templates on disk (regenerate it)");

    let (mut equal, mut both_fail, mut refused, mut failures) = (0, 0, 0, Vec::new());
    println!("{:<55} {:<10} result", "template", "messages");
    for fixture in &fixtures.templates {
        let bytes = std::fs::read(dir.join(&fixture.template)).expect("read template");
        let digest = hex::encode(Sha256::digest(&bytes));
        let source = if digest != fixture.sha256 {
            Err(format!("sha256 {digest} is not the fixture's {}", fixture.sha256))
        } else {
            String::from_utf8(bytes).map_err(|_| "template is not UTF-8".to_owned())
        };
        for case in &fixture.cases {
            let outcome = source.clone().and_then(|source| check(&fixture.template, case, &source));
            let line = match outcome {
                Ok(Outcome::Equal) => {
                    equal += 1;
                    "equal".to_owned()
                }
                Ok(Outcome::BothFail(why)) => {
                    both_fail += 1;
                    format!("refused, as by jinja2: {why}")
                }
                Ok(Outcome::Refused(why)) => {
                    refused += 1;
                    format!("refused: {why}")
                }
                Err(why) => {
                    failures.push(format!("{} ({})", fixture.template, case.conversation));
                    format!("FAIL: {why}")
                }
            };
            println!("{:<55} {:<10} {line}", fixture.template, case.conversation);
        }
    }
    let cases: usize = fixtures.templates.iter().map(|f| f.cases.len()).sum();
    println!(
        "{} templates, {cases} renders: {equal} equal, {both_fail} refused as by jinja2, \
         {refused} refused for a missing feature, {} failed",
        fixtures.templates.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "not rendered as jinja2 does: {failures:?}");
    // Each listed refusal must still happen (or leave the list).
    let listed = EXPECTED_REFUSALS.len();
    assert_eq!(refused, listed, "EXPECTED_REFUSALS lists a template that now renders");
}

/// The comparison is strict: one changed byte in jinja2's text, or a
/// missing refusal, fails it.
#[test]
fn comparison_catches_a_one_byte_difference() {
    let fixtures: Fixtures =
        serde_json::from_str(include_str!("../../testdata/chat_template_fixtures.json")).expect("fixture JSON");
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}";
    let mut case = fixtures.templates[0].cases[0].clone();
    let text: String = case
        .context
        .messages
        .iter()
        .map(|m| format!("<{}>{}\n", m.role, m.content.as_deref().unwrap_or_default()))
        .collect();
    case.rendered = Some(text.clone());
    case.error = None;
    assert!(matches!(check("t", &case, source), Ok(Outcome::Equal)));
    case.rendered = Some(text.replacen('\n', " \n", 1));
    assert!(check("t", &case, source).is_err());
    case.rendered = Some(text.trim_end().to_owned());
    assert!(check("t", &case, source).is_err());
    case.rendered = None;
    case.error = Some("TemplateError: no".into());
    assert!(check("t", &case, source).is_err());
    let raising = "{{ raise_exception('yes') }}";
    assert!(check("t", &case, raising).is_err(), "a different raise_exception message");
    case.error = Some("TemplateError: yes".into());
    assert!(matches!(check("t", &case, raising), Ok(Outcome::BothFail(_))));
}
