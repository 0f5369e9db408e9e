//! The dashboard's A/B variants page (`GET /variants`) and its JSON (`GET /api/variants`): per variant and tool,
//! the sessions `tooltune proxy` recorded, with intervals and tests against the first variant. The rows come from
//! `tooltune_store::variants`, the function `tooltune traces stats --by variant` prints, so both show the same
//! figures. Variant and tool names come from whoever ran the proxy and from the server: the template escapes them.

use crate::pages::PageError;
use crate::{AppState, WebError};
use axum::Json;
use axum::extract::State;
use axum::response::Html;
use minijinja::context;
use serde_json::{Value, json};
use tooltune_store::variants::VariantRow;

fn page_html(
    env: &minijinja::Environment<'static>,
    rows: &[VariantRow],
) -> Result<String, minijinja::Error> {
    let first = rows.first().map(|r| r.variant.clone());
    env.get_template("variants.html")?
        .render(context! { rows, first })
}

/// `GET /variants`: the table of `traces stats --by variant`.
pub(crate) async fn page(State(s): State<AppState>) -> Result<Html<String>, PageError> {
    let rows = s.store.proxy_variant_rows(None).await?;
    Ok(Html(page_html(&s.templates, &rows)?))
}

/// `GET /api/variants`: the same rows as `traces stats --by variant --json`.
pub(crate) async fn api(State(s): State<AppState>) -> Result<Json<Value>, WebError> {
    let rows = s.store.proxy_variant_rows(None).await?;
    Ok(Json(json!({ "variants": rows })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tooltune_store::VariantToolCounts;
    use tooltune_store::variants::variant_rows;

    #[test]
    fn the_page_shows_the_stats_rows_with_untrusted_names_escaped() {
        let counts = |variant: &str, calling: u64| VariantToolCounts {
            variant: variant.into(),
            tool: "search<b>docs</b>".into(),
            sessions: 10,
            sessions_calling: calling,
            calls: calling,
            errors: 0,
        };
        let rows = variant_rows(
            &[counts("a", 2), counts("<script>alert(1)</script>", 9)],
            None,
        );
        let html =
            page_html(&crate::pages::templates().expect("templates"), &rows).expect("render");
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            // minijinja escapes `/` too.
            html.contains("&lt;script&gt;alert(1)&lt;&#x2f;script&gt;"),
            "{html}"
        );
        assert!(
            !html.contains("<b>docs") && html.contains("search&lt;b&gt;docs"),
            "{html}"
        );
        // The figures are those of the rows: the sessions calling it as `rate` prints them, and the p-value.
        assert!(html.contains("20% [6, 51] n=10"), "{html}");
        let p = rows[1].share_p_vs_first.expect("second variant is tested");
        assert!(html.contains(&format!("{p:.3}")), "{html}");
        let empty = page_html(&crate::pages::templates().expect("templates"), &[]).expect("render");
        assert!(empty.contains("No proxy sessions"), "{empty}");
    }
}
