//! How a trajectory's JSON body is kept: LZ4-compressed behind a marker in SQLite, plain text in PostgreSQL.
//!
//! The body is most of a stored trajectory, and in SQLite every byte of it is written twice (to the WAL, then to
//! the database file at the checkpoint that ends an import). Compressing it made a 200,000-trajectory ingest's
//! database about a third smaller and the commit's checkpoint half as long. PostgreSQL already compresses large
//! values itself (TOAST), so there the body stays JSON text. Old SQLite rows hold plain JSON text and are read as
//! they are: a JSON text never begins with the marker's NUL byte.

use std::borrow::Cow;

/// What starts a compressed body: a NUL byte (no JSON text starts with one) and the codec's name.
const MARKER: &[u8] = b"\0lz4";

/// A body ready to bind.
pub(crate) enum StoredBody {
    /// JSON text (PostgreSQL).
    Json(String),
    /// [`MARKER`], the JSON's length (u32, little-endian), then the LZ4 block (SQLite).
    Compressed(Vec<u8>),
}

impl StoredBody {
    /// Bytes this body takes, for the benchmark's sanity sum.
    pub(crate) fn len(&self) -> usize {
        match self {
            StoredBody::Json(s) => s.len(),
            StoredBody::Compressed(b) => b.len(),
        }
    }
}

/// Compresses a JSON body for SQLite, straight into the stored bytes (one allocation: this runs for every record
/// of an ingest). The length prefix is the one `decompress_size_prepended` reads.
pub(crate) fn compress(json: &[u8]) -> Vec<u8> {
    let head = MARKER.len() + 4;
    let mut out = vec![0; head + lz4_flex::block::get_maximum_output_size(json.len())];
    out[..MARKER.len()].copy_from_slice(MARKER);
    // A body over 4 GiB cannot reach here: an ingested record is capped at 64 MiB, a rollout by the model's context.
    out[MARKER.len()..head].copy_from_slice(&(json.len() as u32).to_le_bytes());
    // The buffer has the codec's own worst-case size, so compressing into it cannot run out of room.
    let n = lz4_flex::block::compress_into(json, &mut out[head..])
        .expect("the buffer has the codec's worst-case size");
    out.truncate(head + n);
    out
}

/// The JSON text of a stored body, whichever way it was stored.
pub(crate) fn decode(stored: &[u8]) -> Result<Cow<'_, [u8]>, String> {
    match stored.strip_prefix(MARKER) {
        Some(block) => lz4_flex::block::decompress_size_prepended(block)
            .map(Cow::Owned)
            .map_err(|e| format!("the compressed body does not decompress: {e}")),
        None => Ok(Cow::Borrowed(stored)),
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
        assert_eq!(decode(&stored).expect("decodes").as_ref(), json.as_slice());
    }

    #[test]
    fn a_plain_json_body_from_before_compression_reads_as_it_is() {
        let json = br#"{"task":"t","steps":[]}"#;
        assert!(matches!(decode(json), Ok(Cow::Borrowed(b)) if b == json));
    }

    #[test]
    fn a_damaged_compressed_body_is_an_error_not_garbage() {
        let mut stored = compress(&b"{\"task\":\"x\"}".repeat(10));
        stored.truncate(stored.len() - 3);
        assert!(decode(&stored).is_err());
    }
}
