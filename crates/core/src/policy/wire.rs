//! Schema-registry wire framing shared by Avro and Protobuf values:
//! `raw` (the datum alone) or `confluent` (magic byte 0, then a 4-byte
//! big-endian schema id, then the datum; Protobuf adds message indexes).

use super::{Class, Invalid};

/// How a value's bytes are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Wire {
    #[default]
    Raw,
    Confluent,
}

/// Split a Confluent-framed value into its schema id and payload.
pub(crate) fn confluent_header(bytes: &[u8]) -> Result<(u32, &[u8]), Invalid> {
    match bytes {
        [0, a, b, c, d, rest @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), rest)),
        [m, ..] if *m != 0 => Err(Invalid::poison(
            "decode",
            format!("magic byte is 0x{m:02x}, not 0: not a schema-registry framed value"),
        )),
        _ => Err(Invalid::poison(
            "decode",
            format!(
                "value is {} bytes, too short for the 5-byte schema-registry header",
                bytes.len()
            ),
        )),
    }
}

/// A schema id the policy does not list: the validator cannot decide.
pub(crate) fn unknown_id(id: u32) -> Invalid {
    Invalid {
        class: Class::Unknown,
        rule: "schema_id".into(),
        reason: format!("schema id {id} is not listed in this policy's schema_ids"),
    }
}

/// Read a zigzag varint (Confluent Protobuf message indexes).
pub(crate) fn read_zigzag(buf: &mut &[u8]) -> Option<i64> {
    let mut n: u64 = 0;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        n |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(((n >> 1) as i64) ^ -((n & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header() {
        assert_eq!(
            confluent_header(&[0, 0, 0, 1, 2, 9]).unwrap(),
            (258, &[9u8][..])
        );
        assert_eq!(
            confluent_header(&[1, 0, 0, 0, 1]).unwrap_err().class,
            Class::Poison
        );
        assert_eq!(confluent_header(&[0, 0]).unwrap_err().rule, "decode");
    }

    #[test]
    fn zigzag() {
        let mut b: &[u8] = &[0x00, 0x02, 0x01, 0x04];
        assert_eq!(read_zigzag(&mut b), Some(0));
        assert_eq!(read_zigzag(&mut b), Some(1));
        assert_eq!(read_zigzag(&mut b), Some(-1));
        assert_eq!(read_zigzag(&mut b), Some(2));
        assert_eq!(read_zigzag(&mut b), None);
    }
}
