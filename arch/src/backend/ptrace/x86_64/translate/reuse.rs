//! A process attached again reuses the code cache an earlier session left in it (issue 29).
//!
//! After a detach the cache's regions and thread-state blocks stay mapped in the process,
//! idle. A later session may overwrite them only if no thread can still run in them or return
//! into them, which only a clean detach guarantees (every thread brought out of the cache and
//! checked): a SIGKILLed itrace leaves threads running in the cache until their next trap, and
//! a signal delivered meanwhile puts a cache pc in a signal frame. So:
//!
//! - a clean detach writes a **record** into the first region, after the cache's own `syscall`
//!   gadget: a magic, a version, a "clean" flag, the region size, and the regions and state
//!   blocks it leaves;
//! - a later session looks for it before it maps its first region: an anonymous `r-xp` mapping
//!   of the region size that starts with the gadget and holds a clean record naming its own
//!   base. It clears the flag at once (a kill during that session makes the next one map new
//!   regions), and takes each listed region and block that is still there, anonymous, with its
//!   permissions and its tag (its magic and its own base, written when it was mapped; the
//!   program may have unmapped it and mapped something else there).
//!
//! A killed session never writes "clean": what it leaves is never reused.

use super::layout::STATE_BYTES;
use super::unit::REMOTE_SAVE_BYTES;
use super::MapRange;

/// Where the record starts in the first region: after the gadget (`unit::remote_call_gadget`,
/// about 150 bytes).
pub(super) const RECORD_OFF: u64 = 0x100;
/// The first region's first page holds the gadget and the record; units go after it.
pub(super) const FIRST_FLOOR: u64 = 0x1000;
/// Every other region starts with its tag: units go after it.
pub(super) const REGION_TAG_BYTES: u64 = 16;
/// Where a state block's tag is (in its first page, after the slots `layout.rs` uses).
pub(super) const STATE_TAG: u64 = 0x800;

const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"itrcache");
const REGION_MAGIC: u64 = u64::from_le_bytes(*b"itrcregn");
const STATE_MAGIC: u64 = u64::from_le_bytes(*b"itrcstat");
const VERSION: u64 = 1;

/// The record's words: magic, version, clean, its region's base, the region size, the state
/// block size, the number of other regions, the number of state blocks; then their bases.
const HEADER_WORDS: usize = 8;
/// The clean flag's offset in the record.
pub(super) const CLEAN_OFF: u64 = 2 * 8;
/// The most bases the record holds (regions first: 128 at most; the state blocks beyond the
/// rest stay mapped, idle, and are not reused).
pub(super) const CAPACITY: usize = ((FIRST_FLOOR - RECORD_OFF) / 8) as usize - HEADER_WORDS;

/// What an earlier clean detach left, as its record lists it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Leftovers {
    /// The regions other than the first (the record's own).
    pub(super) regions: Vec<u64>,
    pub(super) states: Vec<u64>,
}

/// The record for the first region at `first` (of `region_bytes`), the other regions and the
/// state blocks: what it lists (a prefix of `states` when they do not all fit) and its bytes.
pub(super) fn record(first: u64, region_bytes: u64, regions: &[u64], states: &[u64], clean: bool) -> Vec<u8> {
    let regions = &regions[..regions.len().min(CAPACITY)];
    let states = &states[..states.len().min(CAPACITY - regions.len())];
    let header = [
        RECORD_MAGIC,
        VERSION,
        clean as u64,
        first,
        region_bytes,
        STATE_BYTES,
        regions.len() as u64,
        states.len() as u64,
    ];
    header.iter().chain(regions).chain(states).flat_map(|w| w.to_le_bytes()).collect()
}

/// The leftovers a clean record in `page` (the first `FIRST_FLOOR` bytes of a mapping at `at`)
/// lists, for regions of `region_bytes`; `gadget` is the cache's `syscall` gadget for `at`
/// (`unit::remote_call_gadget`: its save area, which each call rewrites, is not compared).
/// `None`: not a region of ours with a clean record.
pub(super) fn clean_record(page: &[u8], at: u64, region_bytes: u64, gadget: &[u8]) -> Option<Leftovers> {
    let code = REMOTE_SAVE_BYTES as usize..gadget.len();
    if page.len() < FIRST_FLOOR as usize || gadget.len() > RECORD_OFF as usize || page[code.clone()] != gadget[code] {
        return None;
    }
    let word = |n: usize| {
        let o = RECORD_OFF as usize + n * 8;
        u64::from_le_bytes(page[o..o + 8].try_into().expect("8 bytes"))
    };
    let header: Vec<u64> = (0..HEADER_WORDS).map(word).collect();
    if header[..6] != [RECORD_MAGIC, VERSION, 1, at, region_bytes, STATE_BYTES] {
        return None;
    }
    let (regions, states) = (header[6] as usize, header[7] as usize);
    if regions.checked_add(states).is_none_or(|n| n > CAPACITY) {
        return None;
    }
    let bases = |from: usize, n: usize| (from..from + n).map(word).collect::<Vec<u64>>();
    Some(Leftovers { regions: bases(HEADER_WORDS, regions), states: bases(HEADER_WORDS + regions, states) })
}

/// A region's tag (at its start), or a state block's (at `STATE_TAG`): its magic and base.
pub(super) fn region_tag(base: u64) -> [u8; 16] {
    tag(REGION_MAGIC, base)
}

pub(super) fn state_tag(base: u64) -> [u8; 16] {
    tag(STATE_MAGIC, base)
}

fn tag(magic: u64, base: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&magic.to_le_bytes());
    t[8..].copy_from_slice(&base.to_le_bytes());
    t
}

/// Where a first region may be: the anonymous, private, read-and-execute mappings of exactly
/// the region size.
pub(super) fn first_region_candidates(maps: &[MapRange], region_bytes: u64) -> Vec<u64> {
    maps.iter()
        .filter(|m| m.anonymous && &m.perms == b"r-xp" && m.end - m.start == region_bytes)
        .map(|m| m.start)
        .collect()
}

/// Whether `start..start + len` is inside one anonymous private mapping with permissions
/// `perms` (the kernel merges neighbours alike: the state blocks, side by side, are one line).
pub(super) fn mapped_as(maps: &[MapRange], start: u64, len: u64, perms: &[u8; 4]) -> bool {
    maps.iter().any(|m| m.anonymous && &m.perms == perms && m.start <= start && start.saturating_add(len) <= m.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(start: u64, end: u64, perms: &[u8; 4]) -> MapRange {
        MapRange { start, end, stack: false, perms: *perms, anonymous: true }
    }

    #[test]
    fn a_record_lists_what_it_was_given_and_only_a_clean_one_is_read() {
        let gadget = super::super::unit::remote_call_gadget(0x7000_0000).expect("encodes").0;
        assert!(gadget.len() <= RECORD_OFF as usize, "the gadget overlaps the record: {} bytes", gadget.len());
        let at = 0x7000_0000;
        let mut page = vec![0u8; FIRST_FLOOR as usize];
        page[..gadget.len()].copy_from_slice(&gadget);
        // The save area holds the registers of the last call itrace made there.
        page[..8].copy_from_slice(&9u64.to_le_bytes());
        let put = |page: &mut Vec<u8>, r: Vec<u8>| page[RECORD_OFF as usize..][..r.len()].copy_from_slice(&r);
        put(&mut page, record(at, 8 << 20, &[0x7100_0000], &[0x10_0000_0000, 0x10_0020_1000], true));
        let left = clean_record(&page, at, 8 << 20, &gadget).expect("clean");
        assert_eq!(left, Leftovers { regions: vec![0x7100_0000], states: vec![0x10_0000_0000, 0x10_0020_1000] });
        // Another base (a copy moved elsewhere), another region size, no gadget: not ours.
        assert!(clean_record(&page, at + (8 << 20), 8 << 20, &gadget).is_none());
        assert!(clean_record(&page, at, 128 << 10, &gadget).is_none());
        let mut other = page.clone();
        other[REMOTE_SAVE_BYTES as usize + 2] ^= 0xff;
        assert!(clean_record(&other, at, 8 << 20, &gadget).is_none());
        // Not clean: never reused.
        put(&mut page, record(at, 8 << 20, &[0x7100_0000], &[0x10_0000_0000], false));
        assert!(clean_record(&page, at, 8 << 20, &gadget).is_none());
        // Too many state blocks: the record keeps what fits.
        let many: Vec<u64> = (0..1000).map(|k| 0x10_0000_0000 + k * STATE_BYTES).collect();
        let r = record(at, 8 << 20, &[0x7100_0000], &many, true);
        assert_eq!(r.len(), (FIRST_FLOOR - RECORD_OFF) as usize);
        put(&mut page, r);
        let left = clean_record(&page, at, 8 << 20, &gadget).expect("clean");
        assert_eq!(left.states[..], many[..CAPACITY - 1]);
    }

    #[test]
    fn mappings_are_checked_for_place_permissions_and_anonymity() {
        let size = 8 << 20;
        let mut file = anon(0x9000_0000, 0x9000_0000 + size, b"r-xp");
        file.anonymous = false;
        let maps = vec![
            anon(0x7000_0000, 0x7000_0000 + size, b"r-xp"),
            anon(0x8000_0000, 0x8000_0000 + 2 * size, b"r-xp"),
            file,
            anon(0x10_0000_0000, 0x10_0000_0000 + 3 * STATE_BYTES, b"rw-p"),
        ];
        assert_eq!(first_region_candidates(&maps, size), vec![0x7000_0000]);
        assert!(mapped_as(&maps, 0x8000_0000 + size, size, b"r-xp"));
        assert!(!mapped_as(&maps, 0x8000_0000 + size + 4096, size, b"r-xp"));
        assert!(!mapped_as(&maps, 0x9000_0000, size, b"r-xp"));
        assert!(mapped_as(&maps, 0x10_0000_0000 + 2 * STATE_BYTES, STATE_BYTES, b"rw-p"));
        assert!(!mapped_as(&maps, 0x10_0000_0000 + STATE_BYTES, STATE_BYTES, b"r-xp"));
    }
}
