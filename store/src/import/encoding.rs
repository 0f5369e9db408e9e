//! How an import stores bodies (JSON text, LZ4, or zstd with the store's dictionary), and the dictionary an import
//! trains on its first chunk when the store has none yet.

use super::rows::Prepared;
use crate::body::{Dictionary, StoredBody, compress, compress_with};
use rayon::prelude::*;
use std::sync::Arc;

/// How bodies are stored by a transaction.
#[derive(Clone)]
pub(super) enum Encoding {
    /// JSON text (PostgreSQL).
    Text,
    /// LZ4 (SQLite, when no dictionary could be trained).
    Lz4,
    /// zstd with the store's dictionary (SQLite).
    Dictionary(Arc<Dictionary>),
    /// Kept as canonical JSON until a dictionary is trained on them (an import's first chunk into a SQLite store
    /// that has no dictionary yet).
    Pending,
}

impl Encoding {
    pub(super) fn encode(&self, json: Vec<u8>) -> StoredBody {
        match self {
            // serde_json writes UTF-8.
            Encoding::Text => StoredBody::Json(String::from_utf8(json).unwrap_or_default()),
            Encoding::Lz4 => StoredBody::Compressed(compress(&json)),
            Encoding::Dictionary(d) => StoredBody::Compressed(compress_with(&json, d)),
            Encoding::Pending => StoredBody::Pending(json),
        }
    }
}

/// Bodies a dictionary is trained on, at most: a few hundred already capture what one log's bodies share (100 gave
/// the same compression as 1,000 on the bench's), and training on 256 takes about a tenth of a second.
const TRAINING_SAMPLES: usize = 256;
/// Bodies a dictionary is trained on, at least: fewer would make a dictionary of one small file's quirks that
/// every later import of the store then uses.
const MIN_TRAINING_SAMPLES: usize = 64;

/// A dictionary trained by an import, to be stored in its transaction.
pub(super) struct NewDictionary {
    pub(super) dictionary: Arc<Dictionary>,
    pub(super) bytes: Vec<u8>,
    pub(super) samples: usize,
}

/// Trains a dictionary with key `key` on the pending bodies of a chunk (the first [`TRAINING_SAMPLES`]), when it
/// has at least [`MIN_TRAINING_SAMPLES`], and encodes them with it (or with LZ4 when it has too few, or zstd
/// cannot train on them). Returns the encoding for the rest of the import and the new dictionary.
pub(super) fn train_on(valid: &mut [Prepared], key: u32) -> (Encoding, Option<NewDictionary>) {
    let samples: Vec<&[u8]> = valid
        .iter()
        .filter_map(|p| match &p.body {
            StoredBody::Pending(b) => Some(b.as_slice()),
            _ => None,
        })
        .take(TRAINING_SAMPLES)
        .collect();
    let trained = (samples.len() >= MIN_TRAINING_SAMPLES)
        .then(|| crate::body::train(&samples))
        .flatten()
        .map(|bytes| NewDictionary {
            dictionary: Arc::new(Dictionary::new(key, &bytes)),
            samples: samples.len(),
            bytes,
        });
    let encoding = match &trained {
        Some(n) => Encoding::Dictionary(Arc::clone(&n.dictionary)),
        None => Encoding::Lz4,
    };
    encode_pending(valid, &encoding);
    (encoding, trained)
}

/// Encodes, in parallel, the bodies that were kept pending until a dictionary was trained.
pub(super) fn encode_pending(valid: &mut [Prepared], encoding: &Encoding) {
    valid.par_iter_mut().for_each(|p| {
        if let StoredBody::Pending(json) = &mut p.body {
            p.body = encoding.encode(std::mem::take(json));
        }
    });
}
