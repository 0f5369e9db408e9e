//! How the next token is picked: a request's sampler chain (temperature, seed, a ban on the tool-call token) and
//! the tool-call grammar built from the tools' schemas, checked lazily by [`TokenSampler`].

use super::Engine;
use crate::LlmError;
use crate::local::grammar::tool_call_schema;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use tooltune_core::ToolSpec;

/// Picks the next token, optionally under a grammar.
///
/// Checking the grammar against all 151k vocabulary entries at every step is slow (about half a second per
/// token on two busy cores), so, as llama.cpp's own common sampler does, the token is first chosen without
/// the grammar and checked alone; only when the grammar rejects it is the choice repeated over the
/// grammar-filtered vocabulary. For greedy decoding the result is the same as filtering first.
pub(super) struct TokenSampler {
    base: LlamaSampler,
    grammar: Option<LlamaSampler>,
}

impl TokenSampler {
    pub(super) fn sample(&mut self, ctx: &LlamaContext<'_>, idx: i32) -> LlamaToken {
        let t = self.base.sample(ctx, idx);
        let Some(g) = self.grammar.as_mut() else {
            return t;
        };
        let logit = ctx.get_logits_ith(idx)[t.0 as usize];
        let mut one = LlamaTokenDataArray::new(vec![LlamaTokenData::new(t, logit, 0.0)], false);
        one.apply_sampler(g);
        let t = if one.data[0].logit().is_finite() {
            t
        } else {
            let mut all = ctx.token_data_array_ith(idx);
            all.apply_sampler(g);
            all.apply_sampler(&mut self.base);
            all.selected_token().unwrap_or(t)
        };
        g.accept(t);
        t
    }
}

impl<'m> Engine<'m> {
    pub(super) fn grammar_for(&mut self, tools: &[ToolSpec]) -> Result<String, LlmError> {
        let key = serde_json::to_string(tools).unwrap_or_default();
        if let Some(g) = self.grammars.get(&key) {
            return Ok(g.clone());
        }
        let usable =
            |s: &serde_json::Value| llama_cpp_2::json_schema_to_grammar(&s.to_string()).is_ok();
        let schema = tool_call_schema(tools, usable);
        let g = llama_cpp_2::json_schema_to_grammar(&schema.to_string()).map_err(|e| {
            LlmError::InvalidRequest(format!(
                "the tools' schemas cannot be turned into a grammar ({e}); tools: {}",
                tools
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        self.grammars.insert(key, g.clone());
        Ok(g)
    }

    pub(super) fn sampler(
        &self,
        grammar: Option<&str>,
        temperature: f32,
        seed: u32,
        forbid_calls: bool,
    ) -> Result<TokenSampler, LlmError> {
        let grammar = match grammar {
            Some(g) => Some(
                LlamaSampler::grammar(self.model, g, "root")
                    .map_err(|e| self.err(format!("compiling a grammar: {e}")))?,
            ),
            None => None,
        };
        let mut chain = Vec::new();
        if forbid_calls && let Some(open) = self.tool_call_open {
            chain.push(LlamaSampler::logit_bias(
                self.model.n_vocab(),
                &[LlamaLogitBias::new(open, f32::NEG_INFINITY)],
            ));
        }
        if temperature > 0.0 {
            chain.push(LlamaSampler::temp(temperature));
            chain.push(LlamaSampler::dist(seed));
        } else {
            chain.push(LlamaSampler::greedy());
        }
        let base = LlamaSampler::chain_simple(chain);
        Ok(TokenSampler { base, grammar })
    }
}
