//! Where the memory of a graph's recorded ops comes from.
//!
//! Outside a capture every tensor is a stream-ordered pool allocation. Recorded into a graph,
//! each of those would become an allocation node and each free a free node, and a kernel
//! that follows such a node depends on it with a plain edge: the programmatic dependent
//! launch that lets a kernel start during its predecessor's tail (`launch_raw`) only links
//! kernels that follow each other directly. So while the compute stream is captured, the
//! capturing thread's allocations are carved out of one plain device allocation, the
//! arena, and their frees only return the range here, on the host: the recorded step is
//! kernels alone.
//!
//! All graphs share the arena. That is safe because a graph's tensors all die inside its
//! recording (checked when it ends: only tensors made before the recording, such as the
//! graph's inputs and logits, outlive it) and graphs replay one at a time on the one stream,
//! so no two replays' ops ever hold arena memory at once. Ranges are placed first fit in a
//! space of offsets without an end; a recording that reaches past the arena gets pool
//! memory for what does not fit, and says how far it reached, so the backend can grow the
//! arena and record again (graphs are recorded largest first, so only the first one does).

/// Arena ranges start on this boundary, as the pool's allocations do.
pub(super) const ALIGN: usize = 256;

/// First-fit placement of ranges in `[0, ∞)`.
#[derive(Debug, Default)]
pub(super) struct Offsets {
    /// Free ranges `(start, len)` below `top`, sorted by start, never adjacent.
    holes: Vec<(usize, usize)>,
    /// The end of the highest range in use.
    top: usize,
    /// The highest `top` since the last [`Self::reset_peak`].
    peak: usize,
    /// Ranges in use.
    live: usize,
}

impl Offsets {
    /// Places `len` bytes (rounded up to [`ALIGN`]) and returns the range's start and length.
    pub(super) fn take(&mut self, len: usize) -> (usize, usize) {
        let len = len.div_ceil(ALIGN) * ALIGN;
        self.live += 1;
        if let Some(i) = self.holes.iter().position(|&(_, l)| l >= len) {
            let (start, l) = self.holes[i];
            if l == len {
                self.holes.remove(i);
            } else {
                self.holes[i] = (start + len, l - len);
            }
            return (start, len);
        }
        let start = self.top;
        self.top += len;
        self.peak = self.peak.max(self.top);
        (start, len)
    }

    /// Returns a range that [`Self::take`] gave out.
    pub(super) fn give(&mut self, start: usize, len: usize) {
        debug_assert!(self.live > 0 && start + len <= self.top, "range {start}+{len} was not taken");
        self.live -= 1;
        let i = self.holes.partition_point(|&(s, _)| s < start);
        self.holes.insert(i, (start, len));
        // Join with the next hole, then with the previous one.
        if i + 1 < self.holes.len() && start + len == self.holes[i + 1].0 {
            self.holes[i].1 += self.holes[i + 1].1;
            self.holes.remove(i + 1);
        }
        if i > 0 && self.holes[i - 1].0 + self.holes[i - 1].1 == start {
            self.holes[i - 1].1 += self.holes[i].1;
            self.holes.remove(i);
        }
        // A hole that reaches the top lowers it.
        if let Some(&(s, l)) = self.holes.last()
            && s + l == self.top
        {
            self.top = s;
            self.holes.pop();
        }
    }

    /// Ranges in use.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// The most bytes in use at once since the last reset.
    pub(super) fn peak(&self) -> usize {
        self.peak
    }

    pub(super) fn reset_peak(&mut self) {
        self.peak = self.top;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_aligned_and_reused_first_fit() {
        let mut o = Offsets::default();
        let a = o.take(1);
        let b = o.take(300);
        let c = o.take(256);
        assert_eq!((a, b, c), ((0, 256), (256, 512), (768, 256)));
        o.give(b.0, b.1);
        // The hole of `b` takes a smaller range first, and what is left of it next.
        assert_eq!(o.take(100), (256, 256));
        assert_eq!(o.take(256), (512, 256));
        assert_eq!(o.take(1), (1024, 256));
        assert_eq!(o.peak(), 1280);
        assert_eq!(o.live(), 5);
    }

    #[test]
    fn freed_neighbours_join_and_the_top_comes_down() {
        let mut o = Offsets::default();
        let r: Vec<_> = (0..4).map(|_| o.take(256)).collect();
        o.give(r[1].0, r[1].1);
        o.give(r[2].0, r[2].1);
        // One hole of 512 between r0 and r3.
        assert_eq!(o.take(512), (256, 512));
        o.give(256, 512);
        o.give(r[3].0, r[3].1);
        o.give(r[0].0, r[0].1);
        assert_eq!(o.live(), 0);
        assert_eq!(o.take(1024), (0, 1024), "everything free again: the space starts at 0");
        assert_eq!(o.peak(), 1024);
    }

    #[test]
    fn the_peak_is_the_most_in_use_at_once() {
        let mut o = Offsets::default();
        let a = o.take(1000);
        o.give(a.0, a.1);
        o.reset_peak();
        assert_eq!(o.peak(), 0);
        let b = o.take(256);
        let c = o.take(256);
        o.give(b.0, b.1);
        o.give(c.0, c.1);
        assert_eq!(o.peak(), 512);
    }
}
