//! How a trajectory's JSON body is kept: compressed behind a marker in SQLite (zstd with the store's dictionary,
//! or LZ4 before the store has one), plain text in PostgreSQL.
//!
//! The body is most of a stored trajectory, and in SQLite every byte of it is written twice (to the WAL, then to
//! the database file at the checkpoint that ends an import). Compressing it with LZ4 made a 200,000-trajectory
//! ingest's database about a third smaller and the commit's checkpoint half as long. The bodies of one log share
//! most of their text (the system prompt, the step and field names, the phrasing of a task template), which a
//! lone 3 KB body cannot exploit but a dictionary trained on a few hundred of them can: zstd (level 1) with a
//! 16 KiB dictionary keeps a bench body in 760 bytes against LZ4's 2,000, at 12-17 µs a body against LZ4's 9.
//! Measured end to end on 200,000 trajectories: the database 499 to 230 MB, the commit 2.9 to 1.4 s; the import
//! 3.5% faster for tooltune records and 12% for OTLP (the extra compression time is spent on the parsing threads,
//! in parallel, and the SQLite thread writes half the bytes).
//!
//! A store trains its dictionary once, from the first import that brings enough records (see
//! `import/encoding.rs`), keeps it in `body_dictionaries`, and compresses every later body with it; a body names its
//! dictionary by key, so a dictionary is never changed or removed. PostgreSQL already compresses large values itself
//! (TOAST), so there the body stays JSON text. Old SQLite rows hold LZ4 blocks or plain JSON text and are read as
//! they are: a JSON text never begins with a marker's NUL byte.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use zstd::zstd_safe;

/// What starts an LZ4 body: a NUL byte (no JSON text starts with one) and the codec's name.
const LZ4: &[u8] = b"\0lz4";
/// What starts a zstd body; then the dictionary's key (u32, little-endian), the JSON's length (u32, little-endian)
/// and a zstd frame.
const ZSTD: &[u8] = b"\0zsd";
/// The zstd level: 1 is the fastest of the regular levels, and with a dictionary it already finds most matches.
const LEVEL: i32 = 1;
/// Dictionary size: 8 and 64 KiB compressed bench bodies within 2% of 16 KiB.
const DICTIONARY_BYTES: usize = 16 * 1024;
/// The largest body a stored length may claim: far above any record an ingest accepts (64 MiB), and a bound on
/// the buffer a damaged length could make a reader allocate.
const MAX_BODY: usize = 1 << 30;

/// A trained dictionary, ready for both directions.
pub(crate) struct Dictionary {
    key: u32,
    encoder: zstd::dict::EncoderDictionary<'static>,
    decoder: zstd::dict::DecoderDictionary<'static>,
}

impl Dictionary {
    /// A dictionary as stored under `key`.
    pub(crate) fn new(key: u32, bytes: &[u8]) -> Dictionary {
        Dictionary {
            key,
            encoder: zstd::dict::EncoderDictionary::copy(bytes, LEVEL),
            decoder: zstd::dict::DecoderDictionary::copy(bytes),
        }
    }

    pub(crate) fn key(&self) -> u32 {
        self.key
    }
}

/// Dictionaries a [`crate::Store`] has read or committed, by key. A dictionary never changes once committed, so
/// entries never go stale.
#[derive(Clone, Default)]
pub(crate) struct Dictionaries(Arc<Mutex<HashMap<u32, Arc<Dictionary>>>>);

impl Dictionaries {
    pub(crate) fn get(&self, key: u32) -> Option<Arc<Dictionary>> {
        self.lock().get(&key).cloned()
    }

    pub(crate) fn insert(&self, dictionary: Arc<Dictionary>) {
        self.lock().insert(dictionary.key, dictionary);
    }

    /// Makes the dictionary stored as `bytes` under `key` and caches it.
    pub(crate) fn insert_stored(&self, key: u32, bytes: &[u8]) -> Arc<Dictionary> {
        let d = Arc::new(Dictionary::new(key, bytes));
        self.insert(Arc::clone(&d));
        d
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Dictionary>>> {
        // The map is whole after every insert, so a panic elsewhere while it was held leaves it usable.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Dictionaries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.lock().keys()).finish()
    }
}

/// Trains a dictionary on sample bodies. `None` when zstd's trainer cannot make one from them (too few, or too
/// alike to yield a dictionary of the asked size).
pub(crate) fn train(samples: &[&[u8]]) -> Option<Vec<u8>> {
    zstd::dict::from_samples(samples, DICTIONARY_BYTES).ok()
}

/// A body ready to bind.
pub(crate) enum StoredBody {
    /// JSON text (PostgreSQL).
    Json(String),
    /// A marker and its codec's bytes (SQLite).
    Compressed(Vec<u8>),
    /// Canonical JSON not yet compressed: an import's first chunk, kept until its dictionary is trained.
    Pending(Vec<u8>),
}

impl StoredBody {
    /// Bytes this body takes, for the benchmark's sanity sum.
    pub(crate) fn len(&self) -> usize {
        match self {
            StoredBody::Json(s) => s.len(),
            StoredBody::Compressed(b) | StoredBody::Pending(b) => b.len(),
        }
    }
}

/// Writes the marker and the JSON's length, in a zeroed buffer of `head + room` bytes.
fn framed(
    marker: &[u8],
    dictionary: Option<u32>,
    json_len: usize,
    room: usize,
) -> (Vec<u8>, usize) {
    let head = marker.len() + 4 * (1 + usize::from(dictionary.is_some()));
    let mut out = vec![0; head + room];
    out[..marker.len()].copy_from_slice(marker);
    let mut at = marker.len();
    if let Some(key) = dictionary {
        out[at..at + 4].copy_from_slice(&key.to_le_bytes());
        at += 4;
    }
    // A body over 4 GiB cannot reach here: an ingested record is capped at 64 MiB, a rollout by the model's context.
    out[at..at + 4].copy_from_slice(&(json_len as u32).to_le_bytes());
    (out, head)
}

/// Compresses a JSON body with LZ4, straight into the stored bytes (one allocation: this runs for every record of
/// an ingest into a store that has no dictionary yet).
pub(crate) fn compress(json: &[u8]) -> Vec<u8> {
    let (mut out, head) = framed(
        LZ4,
        None,
        json.len(),
        lz4_flex::block::get_maximum_output_size(json.len()),
    );
    // The buffer has the codec's own worst-case size, so compressing into it cannot run out of room.
    let n = lz4_flex::block::compress_into(json, &mut out[head..])
        .expect("the buffer has the codec's worst-case size");
    out.truncate(head + n);
    out
}

thread_local! {
    /// A compression and a decompression context per thread: making one allocates its tables, which would be
    /// a large part of compressing one small body.
    static CONTEXTS: RefCell<(zstd_safe::CCtx<'static>, zstd_safe::DCtx<'static>)> =
        RefCell::new((zstd_safe::CCtx::create(), zstd_safe::DCtx::create()));
}

/// Compresses a JSON body with zstd and `dictionary`.
pub(crate) fn compress_with(json: &[u8], dictionary: &Dictionary) -> Vec<u8> {
    let room = zstd_safe::compress_bound(json.len());
    let (mut out, head) = framed(ZSTD, Some(dictionary.key), json.len(), room);
    let n = CONTEXTS.with_borrow_mut(|(c, _)| {
        c.compress_using_cdict(&mut out[head..], json, dictionary.encoder.as_cdict())
    });
    match n {
        Ok(n) => {
            out.truncate(head + n);
            out
        }
        // Compressing into a buffer of zstd's own bound fails only if zstd cannot allocate its tables; LZ4
        // needs none, and the body stays readable either way.
        Err(_) => compress(json),
    }
}

/// How a stored body must be decoded.
pub(crate) enum Codec {
    /// JSON text, as it is.
    Plain,
    /// An LZ4 block.
    Lz4,
    /// A zstd frame made with the dictionary of this key (`None`: the body is cut short before its key).
    Zstd(Option<u32>),
}

/// The little-endian u32 at the start of `bytes`, if there are four.
fn le_u32(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// Which codec a stored body needs, so that the caller can fetch a dictionary before [`decode`].
pub(crate) fn codec(stored: &[u8]) -> Codec {
    if stored.starts_with(LZ4) {
        Codec::Lz4
    } else if let Some(rest) = stored.strip_prefix(ZSTD) {
        Codec::Zstd(le_u32(rest))
    } else {
        Codec::Plain
    }
}

/// The JSON text of a stored body, whichever way it was stored. `dictionary` is the one [`codec`] named, if any.
pub(crate) fn decode<'a>(
    stored: &'a [u8],
    dictionary: Option<&Dictionary>,
) -> Result<Cow<'a, [u8]>, String> {
    match codec(stored) {
        Codec::Plain => Ok(Cow::Borrowed(stored)),
        Codec::Lz4 => lz4_flex::block::decompress_size_prepended(&stored[LZ4.len()..])
            .map(Cow::Owned)
            .map_err(|e| format!("the compressed body does not decompress: {e}")),
        Codec::Zstd(None) => Err("the compressed body is cut short".to_string()),
        Codec::Zstd(Some(key)) => {
            let dictionary = dictionary.filter(|d| d.key == key).ok_or_else(|| {
                format!("the body needs compression dictionary {key}, which the store lacks")
            })?;
            let rest = &stored[ZSTD.len() + 4..];
            let len = le_u32(rest).ok_or("the compressed body is cut short")? as usize;
            let frame = &rest[4..];
            if len > MAX_BODY {
                return Err(format!("the compressed body claims {len} bytes"));
            }
            let mut json = Vec::with_capacity(len);
            let n = CONTEXTS
                .with_borrow_mut(|(_, d)| {
                    d.decompress_using_ddict(&mut json, frame, dictionary.decoder.as_ddict())
                })
                .map_err(|code| {
                    format!(
                        "the compressed body does not decompress: {}",
                        zstd_safe::get_error_name(code)
                    )
                })?;
            if n != len {
                return Err(format!(
                    "the compressed body holds {n} bytes, not the {len} it claims"
                ));
            }
            Ok(Cow::Owned(json))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compressed_body_decodes_to_its_json() {
        let json = br#"{"task":"Read notes.txt and sum the numbers in it.","steps":[]}"#.repeat(20);
        let stored = compress(&json);
        assert!(stored.len() < json.len() / 4, "{} bytes", stored.len());
        assert_eq!(
            decode(&stored, None).expect("decodes").as_ref(),
            json.as_slice()
        );
    }

    #[test]
    fn a_plain_json_body_from_before_compression_reads_as_it_is() {
        let json = br#"{"task":"t","steps":[]}"#;
        assert!(matches!(decode(json, None), Ok(Cow::Borrowed(b)) if b == json));
    }

    #[test]
    fn a_damaged_compressed_body_is_an_error_not_garbage() {
        let mut stored = compress(&b"{\"task\":\"x\"}".repeat(10));
        stored.truncate(stored.len() - 3);
        assert!(decode(&stored, None).is_err());
    }

    /// Bodies alike in the way one log's are: the same keys and prompt, different values.
    fn bodies(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                format!(
                    r#"{{"meta":{{"source":"tooltune"}},"outcome":{{"score":{}}},"steps":[{{"content":"Refund order {i} of customer {}","type":"user"}},{{"content":"Looking it up.","tool_calls":[{{"arguments":{{"order_id":"{i}"}},"id":"c{i}","name":"search_orders"}}],"type":"model"}}],"system":"You are the operations assistant of a small online shop.","task":"Refund order {i}"}}"#,
                    i % 7,
                    i * 7919 % 1013
                )
                .into_bytes()
            })
            .collect()
    }

    fn trained(key: u32) -> Dictionary {
        let samples = bodies(300);
        let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        Dictionary::new(
            key,
            &train(&samples).expect("300 bodies train a dictionary"),
        )
    }

    #[test]
    fn a_body_compressed_with_a_dictionary_decodes_with_it_only() {
        let dictionary = trained(7);
        let json = &bodies(301)[300];
        let stored = compress_with(json, &dictionary);
        assert!(matches!(codec(&stored), Codec::Zstd(Some(7))));
        assert!(
            stored.len() < compress(json).len(),
            "the dictionary must beat LZ4 on a body like its samples"
        );
        assert_eq!(
            decode(&stored, Some(&dictionary))
                .expect("decodes")
                .as_ref(),
            json.as_slice()
        );
        let missing = decode(&stored, None).expect_err("no dictionary");
        assert!(missing.contains("dictionary 7"), "{missing}");
        let other = trained(8);
        assert!(
            decode(&stored, Some(&other)).is_err(),
            "a dictionary of another key is refused"
        );
    }

    #[test]
    fn a_damaged_zstd_body_is_an_error_not_garbage() {
        let dictionary = trained(1);
        let stored = compress_with(&bodies(1)[0], &dictionary);
        // Cut inside the frame, inside the claimed length, and inside the key.
        for cut in [
            1,
            5,
            stored.len() - ZSTD.len() - 6,
            stored.len() - ZSTD.len() - 2,
        ] {
            let short = &stored[..stored.len() - cut];
            assert!(decode(short, Some(&dictionary)).is_err(), "cut by {cut}");
        }
        let mut lying = stored.clone();
        lying[ZSTD.len() + 4] ^= 1; // the claimed length
        assert!(decode(&lying, Some(&dictionary)).is_err());
    }

    #[test]
    fn too_few_samples_train_no_dictionary() {
        let samples = bodies(2);
        let samples: Vec<&[u8]> = samples.iter().map(Vec::as_slice).collect();
        assert!(train(&samples).is_none());
    }
}
