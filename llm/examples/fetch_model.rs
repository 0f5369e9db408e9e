//! Fetches the embedded model(s) into the default models folder: `cargo run -p tooltune-llm --example
//! fetch_model -- [default|fast]...` (the library path behind `tooltune model fetch`).

#[tokio::main]
async fn main() -> Result<(), tooltune_llm::LlmError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = if args.is_empty() {
        vec!["default".to_string()]
    } else {
        args
    };
    for a in args {
        let which = tooltune_llm::ModelChoice::parse(&a)?;
        let path = tooltune_llm::ensure_model(which, None, true).await?;
        println!("{}", path.display());
    }
    Ok(())
}
