//! JSON lines read with a bound on each line: an overlong line is passed over without being
//! held (only counted), so neither a corrupt state file nor an odd audit trail can make one
//! allocation as large as itself.

use std::io::{self, BufRead};

/// One line as read.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// Its bytes, without the newline.
    Text(Vec<u8>),
    /// It was longer than the bound: this many bytes, passed over.
    TooLong(usize),
}

/// Reads the lines of `reader`, each at most `max` bytes (newline excluded).
pub(super) struct BoundedLines<R> {
    reader: R,
    max: usize,
    /// Bytes read so far, newlines included.
    pub(super) read: u64,
}

impl<R: BufRead> BoundedLines<R> {
    pub(super) fn new(reader: R, max: usize) -> BoundedLines<R> {
        BoundedLines {
            reader,
            max,
            read: 0,
        }
    }

    /// The next line; `None` at the end (a last line without a newline counts).
    pub(super) fn next_line(&mut self) -> io::Result<Option<Line>> {
        let mut text = Vec::new();
        let mut length = 0usize;
        let mut any = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => return Err(err),
            };
            if available.is_empty() {
                return Ok(any.then(|| self.finish(text, length)));
            }
            any = true;
            let (chunk, ended) = match available.iter().position(|&b| b == b'\n') {
                Some(at) => (&available[..at], true),
                None => (available, false),
            };
            length = length.saturating_add(chunk.len());
            if length <= self.max {
                text.extend_from_slice(chunk);
            } else {
                // Past the bound: keep nothing more of this line.
                text = Vec::new();
            }
            let used = chunk.len() + usize::from(ended);
            self.reader.consume(used);
            self.read = self.read.saturating_add(used as u64);
            if ended {
                return Ok(Some(self.finish(text, length)));
            }
        }
    }

    fn finish(&self, text: Vec<u8>, length: usize) -> Line {
        if length > self.max {
            Line::TooLong(length)
        } else {
            Line::Text(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_and_overlong_ones_passed_over() {
        let text = b"ab\n\n0123456789\ncd";
        // A tiny buffer: lines span many reads.
        let reader = io::BufReader::with_capacity(3, &text[..]);
        let mut lines = BoundedLines::new(reader, 5);
        assert_eq!(lines.next_line().unwrap(), Some(Line::Text(b"ab".to_vec())));
        assert_eq!(lines.next_line().unwrap(), Some(Line::Text(Vec::new())));
        assert_eq!(lines.next_line().unwrap(), Some(Line::TooLong(10)));
        assert_eq!(lines.next_line().unwrap(), Some(Line::Text(b"cd".to_vec())));
        assert_eq!(lines.next_line().unwrap(), None);
        assert_eq!(lines.read, text.len() as u64);
    }
}
