//! A server-sent events decoder, by hand: bytes in, the `data` of each complete event out.
//!
//! It follows the WHATWG event-stream rules the OpenAI servers rely on: lines end in `\n`,
//! `\r\n` or `\r`; `data:` lines (one optional space after the colon) are joined with `\n`
//! and dispatched at a blank line; comments (`:`) and other fields (`event`, `id`, `retry`)
//! are skipped. Chunks may split anywhere, even inside a UTF-8 character or a `\r\n`.
//! Bytes that are not UTF-8 make the stream malformed; what the data means (JSON, `[DONE]`)
//! is the caller's business.

/// The stream broke the event-stream format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// Incremental decoder state.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of the line not yet ended.
    line: Vec<u8>,
    /// `data` lines of the event not yet dispatched.
    data: Option<String>,
    /// The last byte was `\r`: a `\n` right after it ends nothing new.
    after_cr: bool,
}

impl SseDecoder {
    /// Feeds bytes; returns the data of every event they complete.
    ///
    /// # Errors
    /// A line that is not UTF-8.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<String>, Malformed> {
        let mut events = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => self.end_line(&mut events)?,
                _ => self.line.push(b),
            }
        }
        Ok(events)
    }

    /// The end of the stream: an event whose blank line never came is still delivered
    /// (some servers end with `data: [DONE]\n` alone).
    ///
    /// # Errors
    /// A last line that is not UTF-8.
    pub fn finish(&mut self) -> Result<Option<String>, Malformed> {
        if !self.line.is_empty() {
            // A non-blank line only adds to the pending data; it dispatches nothing.
            self.end_line(&mut Vec::new())?;
        }
        Ok(self.data.take())
    }

    fn end_line(&mut self, events: &mut Vec<String>) -> Result<(), Malformed> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            events.extend(self.data.take());
            return Ok(());
        }
        let line = String::from_utf8(line).map_err(|_| Malformed("an event line is not UTF-8".into()))?;
        let (field, value) = line.split_once(':').unwrap_or((&line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_split_and_every_line_ending() {
        let stream = ": keep-alive\r\nevent: chunk\ndata: {\"a\": \"é\"}\r\n\r\ndata:x\ndata: y\n\ndata: [DONE]\r\r";
        let whole = SseDecoder::default().feed(stream.as_bytes()).unwrap();
        assert_eq!(whole, ["{\"a\": \"é\"}", "x\ny", "[DONE]"]);
        for split in 1..stream.len() {
            let mut d = SseDecoder::default();
            let mut got = d.feed(&stream.as_bytes()[..split]).unwrap();
            got.extend(d.feed(&stream.as_bytes()[split..]).unwrap());
            assert_eq!(got, whole, "split at byte {split}");
        }
    }

    #[test]
    fn an_unterminated_last_event_is_delivered_and_bad_bytes_are_malformed() {
        let mut d = SseDecoder::default();
        assert!(d.feed(b"data: [DONE]").unwrap().is_empty());
        assert_eq!(d.finish().unwrap().as_deref(), Some("[DONE]"));
        let mut d = SseDecoder::default();
        assert!(d.feed(b"data: 1\n").unwrap().is_empty());
        assert_eq!(d.finish().unwrap().as_deref(), Some("1"));
        assert_eq!(SseDecoder::default().finish().unwrap(), None);
        assert!(SseDecoder::default().feed(b"data: \xff\n\n").is_err());
    }
}
