//! Authenticated data frames.
//!
//! Each job gets a random 256-bit key when its rendezvous completes (the switch draws it from
//! the OS); the key travels in the job's [`crate::control::JobSpec`] to every switch, the PS
//! and the workers. Every datagram of the job is its frame followed by a 24-byte trailer: the
//! sealer's 64-bit sequence number (big endian) and a 16-byte tag, the first 128 bits of a keyed
//! PRF under the job's key over the frame (envelope, header, values), the sequence number and
//! the link the datagram crosses ([`Link`]: who sealed it and for whom, as both ends know them).
//! HMAC-SHA256 (RustCrypto's `hmac` and `sha2`; SHA-NI makes it about 0.27 us for a 306-byte
//! frame) for frames under [`WIDE_FRAME_BYTES`], BLAKE3 (the `blake3` crate, its authors') for
//! longer ones: the keyed hash, under a key derived from the job's, of the frame's head
//! followed by the plain BLAKE3 hash of its tail (hash-then-MAC: the tail's hash is collision
//! resistant), then the sequence number and the link. The tail is the frame's last whole
//! multiple of 1,024 bytes, which BLAKE3 hashes
//! as 1 KiB chunks eight at a time (AVX2); the head, the `len % 1024` bytes before it, holds
//! the envelope and header when the values fill whole kibibytes (2,048 values: a 37-byte
//! head). Copies of one frame that differ only in the head (a switch's result to each worker:
//! address and worker id) then share the tail's hash, so a switch hashes a result's values
//! once, not once per worker ([`FrameMac::seal_reusing`]). Measured on this machine (AMD EPYC, SHA-NI, AVX2): at 8 KiB
//! HMAC-SHA256 takes 5.3 us a frame (1.55 GB/s), BLAKE3 2.3 (3.6 GB/s: it hashes the 1 KiB
//! chunks side by side), while below 4 KiB BLAKE3 is the slower (0.37 against 0.27 us at
//! 306 B). Tagging every datagram is the runtime's largest CPU cost with 8 KiB datagrams (a
//! quarter of all CPU in a 4-worker allreduce). Every
//! receiver (switch, PS, worker) checks the tag, in constant time, before anything else reads the
//! frame: a datagram without a valid tag for the job its header names is counted by reason and
//! dropped. Each hop that rewrites a frame (a switch summing, multicasting) tags what it sends.
//!
//! **Replays** (issue #41). Every sealer numbers what it sends on each link from a start drawn
//! from the clock (nanoseconds since 1970, so a restarted sealer carries on above what it sent
//! before), and every receiver keeps a [`ReplayWindow`] per job and sender: a sequence number
//! seen before, or more than [`REPLAY_WINDOW`] behind the newest, is counted (`replayed`,
//! `stale`) and dropped. The window is checked after the tag, so forged datagrams cannot move
//! it. The tag binds the link, so a datagram sealed for one receiver fails at any other, and one
//! a host sealed fails when replayed from another host's address.
//!
//! What this stops and what it does not is in `docs/runtime.md` (threat model).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Bytes of the tag at the end of every datagram.
pub const TAG_BYTES: usize = 16;
/// Bytes of the sequence number before the tag.
pub const SEQ_BYTES: usize = 8;
/// Bytes after every frame: its sequence number and tag.
pub const TRAILER_BYTES: usize = SEQ_BYTES + TAG_BYTES;
/// Sequence numbers a receiver accepts behind the newest it has seen, in any order, once each.
pub const REPLAY_WINDOW: u64 = 4096;
/// [`Link`]'s side that the other end cannot name (a host does not know its switch's node id,
/// so frames to a switch are bound to their sealer alone and frames to a host to it alone).
pub const ANY: u32 = u32::MAX;
/// Set in a parameter server's identity in a [`Link`]: a server shares its host's node id
/// (co-located with a worker) but seals and receives as a party of its own.
pub const SERVER_BIT: u32 = 1 << 31;

/// The link a datagram crosses, as the tag binds it: the sealer and the receiver's identities
/// (node ids, [`SERVER_BIT`] set for a parameter server) or [`ANY`] where the one end cannot know
/// the other's. Between switches both are known; a host's frames are bound to the host
/// (`from`), and a switch's frames to a host to the host (`to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Link {
    pub from: u32,
    pub to: u32,
}

impl Link {
    fn bytes(self, seq: u64) -> [u8; SEQ_BYTES + 8] {
        let mut b = [0u8; SEQ_BYTES + 8];
        b[..SEQ_BYTES].copy_from_slice(&seq.to_be_bytes());
        b[SEQ_BYTES..SEQ_BYTES + 4].copy_from_slice(&self.from.to_be_bytes());
        b[SEQ_BYTES + 4..].copy_from_slice(&self.to.to_be_bytes());
        b
    }
}

/// The first sequence number of a sealer started now: nanoseconds since 1970, so one that
/// restarts under the same job key is not taken for a replay of what it sent before (it sends
/// fewer than 10^9 datagrams a second).
pub fn first_seq() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
}

/// Why a datagram was not accepted as a frame of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forged {
    /// Shorter than a trailer.
    Short,
    /// The tag does not match the frame, sequence number and link under the job's key.
    BadTag,
}

/// Why a well-tagged datagram was dropped as a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Its sequence number was accepted before.
    Replayed,
    /// More than [`REPLAY_WINDOW`] behind the newest accepted.
    Stale,
}

impl Replay {
    pub fn name(self) -> &'static str {
        match self {
            Replay::Replayed => "replayed",
            Replay::Stale => "stale",
        }
    }
}

/// Which of the last [`REPLAY_WINDOW`] sequence numbers of one sender were accepted (a bitmap
/// indexed by the number modulo the window, as RFC 6479).
#[derive(Clone)]
pub struct ReplayWindow {
    /// The newest accepted; `None` before the first.
    top: Option<u64>,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { top: None, bits: [0; (REPLAY_WINDOW / 64) as usize] }
    }
}

impl ReplayWindow {
    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % REPLAY_WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Accepts `seq` once: marks it, or says why not.
    pub fn accept(&mut self, seq: u64) -> Result<(), Replay> {
        let top = match self.top {
            None => {
                self.top = Some(seq);
                let (w, b) = Self::bit(seq);
                self.bits[w] |= b;
                return Ok(());
            }
            Some(t) => t,
        };
        if seq > top {
            if seq - top >= REPLAY_WINDOW {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                // Forget the numbers the window slides past (they alias the new ones).
                for s in top + 1..seq {
                    let (w, b) = Self::bit(s);
                    self.bits[w] &= !b;
                }
            }
            self.top = Some(seq);
            let (w, b) = Self::bit(seq);
            self.bits[w] |= b;
            return Ok(());
        }
        if top - seq >= REPLAY_WINDOW {
            return Err(Replay::Stale);
        }
        let (w, b) = Self::bit(seq);
        if self.bits[w] & b != 0 {
            return Err(Replay::Replayed);
        }
        self.bits[w] |= b;
        Ok(())
    }
}
/// Bytes of a job key.
pub const KEY_BYTES: usize = 32;
/// Frames of at least this many bytes are tagged with BLAKE3, shorter ones with HMAC-SHA256
/// (the length is the frame's own, so sender and receiver agree).
pub const WIDE_FRAME_BYTES: usize = 4096;
/// BLAKE3's chunk: a wide frame's tail is a whole number of them.
const CHUNK_BYTES: usize = 1024;
/// BLAKE3's key derivation context for the wide-frame key (a key per purpose).
const WIDE_KEY_CONTEXT: &str = "inalab 2026-11-24 frame tag, frames of 4096 bytes or more, head and tail hash";

/// A fresh random job key from the operating system.
pub fn random_key() -> [u8; KEY_BYTES] {
    let mut k = [0u8; KEY_BYTES];
    getrandom::fill(&mut k).expect("the operating system's random source");
    k
}

/// A key as the control plane carries it (lower-case hex).
pub fn key_to_hex(key: &[u8; KEY_BYTES]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key a control message gave, or why it is not one.
pub fn key_from_hex(s: &str) -> Result<[u8; KEY_BYTES], String> {
    let bytes = s.as_bytes();
    if bytes.len() != 2 * KEY_BYTES || !bytes.iter().all(u8::is_ascii_hexdigit) {
        return Err(format!("a job key is {} hex digits", 2 * KEY_BYTES));
    }
    let mut k = [0u8; KEY_BYTES];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(k)
}

/// One job's frame authenticator: the keyed HMAC state, cloned for every frame, and the
/// wide frames' BLAKE3 key.
#[derive(Clone)]
pub struct FrameMac {
    keyed: Hmac<Sha256>,
    wide: [u8; KEY_BYTES],
}

impl FrameMac {
    pub fn new(key: &[u8; KEY_BYTES]) -> Self {
        FrameMac { keyed: Hmac::new_from_slice(key).expect("HMAC takes any key length"), wide: blake3::derive_key(WIDE_KEY_CONTEXT, key) }
    }

    fn tag(&self, frame: &[u8], bound: &[u8]) -> [u8; TAG_BYTES] {
        if frame.len() >= WIDE_FRAME_BYTES {
            let (head, tail) = frame.split_at(frame.len() % CHUNK_BYTES);
            return self.wide_tag(head, blake3::hash(tail), bound);
        }
        let mut m = self.keyed.clone();
        m.update(frame);
        m.update(bound);
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&m.finalize().into_bytes()[..TAG_BYTES]);
        tag
    }

    fn wide_tag(&self, head: &[u8], tail: blake3::Hash, bound: &[u8]) -> [u8; TAG_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.wide);
        h.update(head);
        h.update(tail.as_bytes());
        h.update(bound);
        let mut tag = [0u8; TAG_BYTES];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_BYTES]);
        tag
    }

    /// Appends the trailer of `buf[start..]` (one frame just written there) to `buf`: `seq`
    /// and the tag binding frame, `seq` and `link`.
    pub fn seal(&self, buf: &mut Vec<u8>, start: usize, link: Link, seq: u64) {
        self.seal_reusing(buf, start, link, seq, &mut None);
    }

    /// As [`FrameMac::seal`], reusing the tail hash of the frame `last` names when this frame's
    /// tail is the same bytes (checked: a comparison costs a tenth of a hash), and leaving this
    /// frame's in `last`. `last` must come from an earlier call on the same `buf` since it
    /// was last cleared.
    pub fn seal_reusing(&self, buf: &mut Vec<u8>, start: usize, link: Link, seq: u64, last: &mut Option<TailHash>) {
        let bound = link.bytes(seq);
        let frame = &buf[start..];
        if frame.len() < WIDE_FRAME_BYTES {
            let tag = self.tag(frame, &bound);
            buf.extend_from_slice(&seq.to_be_bytes());
            return buf.extend_from_slice(&tag);
        }
        let tail = start + frame.len() % CHUNK_BYTES..buf.len();
        let hash = match last.take() {
            Some(l) if l.tail.len() == tail.len() && buf[l.tail.clone()] == buf[tail.clone()] => l.hash,
            _ => blake3::hash(&buf[tail.clone()]),
        };
        let tag = self.wide_tag(&buf[start..tail.start], hash, &bound);
        *last = Some(TailHash { tail, hash });
        buf.extend_from_slice(&seq.to_be_bytes());
        buf.extend_from_slice(&tag);
    }

    /// The frame of `datagram` and its sequence number if its tag is right for `link`
    /// (compared in constant time). Whether the number is new is the receiver's
    /// [`ReplayWindow`]'s to say.
    pub fn open<'a>(&self, datagram: &'a [u8], link: Link) -> Result<(&'a [u8], u64), Forged> {
        let (frame, seq, tag) = split(datagram)?;
        if bool::from(self.tag(frame, &link.bytes(seq))[..].ct_eq(tag)) {
            Ok((frame, seq))
        } else {
            Err(Forged::BadTag)
        }
    }
}

/// Where a sealed wide frame's tail lies in its buffer, and its hash (see
/// [`FrameMac::seal_reusing`]).
pub struct TailHash {
    tail: std::ops::Range<usize>,
    hash: blake3::Hash,
}

/// A datagram's frame, sequence number and tag, without checking the tag.
pub fn split(datagram: &[u8]) -> Result<(&[u8], u64, &[u8]), Forged> {
    if datagram.len() < TRAILER_BYTES {
        return Err(Forged::Short);
    }
    let (frame, trailer) = datagram.split_at(datagram.len() - TRAILER_BYTES);
    let (seq, tag) = trailer.split_at(SEQ_BYTES);
    Ok((frame, u64::from_be_bytes(seq.try_into().expect("SEQ_BYTES")), tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: Link = Link { from: 7, to: ANY };

    #[test]
    fn tags_are_hmac_sha256_truncated() {
        // The trailer is the sequence number, then the first 16 bytes of HMAC-SHA256 over the
        // frame, the sequence number and the link (big endian).
        let key = [0x0bu8; KEY_BYTES];
        let mac = FrameMac::new(&key);
        let mut buf = b"Hi There".to_vec();
        mac.seal(&mut buf, 0, Link { from: 0x0102_0304, to: ANY }, 0x1122_3344_5566_7788);
        assert_eq!(&buf[8..16], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        let mut reference = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        reference.update(b"Hi There");
        reference.update(&[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 1, 2, 3, 4, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&buf[16..], &reference.finalize().into_bytes()[..TAG_BYTES]);
        // And that HMAC is the standard one: RFC 4231 test case 1 (a 20-byte key of 0x0b).
        let mut rfc = Hmac::<Sha256>::new_from_slice(&[0x0b; 20]).unwrap();
        rfc.update(b"Hi There");
        assert_eq!(&rfc.finalize().into_bytes()[..8], &[0xb0, 0x34, 0x4c, 0x61, 0xd8, 0xdb, 0x38, 0x53]);
    }

    #[test]
    fn wide_frames_are_tagged_by_blake3_under_a_derived_key() {
        let key = [0x0bu8; KEY_BYTES];
        let frame: Vec<u8> = (0..WIDE_FRAME_BYTES).map(|i| i as u8).collect();
        let mut buf = frame.clone();
        FrameMac::new(&key).seal(&mut buf, 0, LINK, 5);
        let derived = blake3::derive_key(WIDE_KEY_CONTEXT, &key);
        let head = WIDE_FRAME_BYTES % CHUNK_BYTES;
        let mut message = frame[..head].to_vec();
        message.extend_from_slice(blake3::hash(&frame[head..]).as_bytes());
        message.extend_from_slice(&LINK.bytes(5));
        assert_eq!(&buf[frame.len()..frame.len() + SEQ_BYTES], &5u64.to_be_bytes());
        assert_eq!(&buf[frame.len() + SEQ_BYTES..], &blake3::keyed_hash(&derived, &message).as_bytes()[..TAG_BYTES]);
        // One byte shorter: HMAC-SHA256.
        let mut short = frame[..WIDE_FRAME_BYTES - 1].to_vec();
        FrameMac::new(&key).seal(&mut short, 0, LINK, 5);
        let mut reference = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        reference.update(&frame[..WIDE_FRAME_BYTES - 1]);
        reference.update(&LINK.bytes(5));
        assert_eq!(&short[WIDE_FRAME_BYTES - 1 + SEQ_BYTES..], &reference.finalize().into_bytes()[..TAG_BYTES]);
    }

    #[test]
    fn a_changed_bit_a_wrong_key_or_link_or_a_short_datagram_is_refused() {
        let (k1, k2) = (random_key(), random_key());
        for frame in [b"frame bytes".to_vec(), vec![7u8; WIDE_FRAME_BYTES + 100]] {
            let mut d = frame.clone();
            FrameMac::new(&k1).seal(&mut d, 0, LINK, 42);
            assert_eq!(FrameMac::new(&k1).open(&d, LINK), Ok((&frame[..], 42)));
            assert_eq!(FrameMac::new(&k2).open(&d, LINK), Err(Forged::BadTag));
            // Sealed by one host, offered as another's; sealed for one receiver, opened by another.
            assert_eq!(FrameMac::new(&k1).open(&d, Link { from: 8, to: ANY }), Err(Forged::BadTag));
            assert_eq!(FrameMac::new(&k1).open(&d, Link { from: 7, to: 3 }), Err(Forged::BadTag));
            for i in (0..d.len()).step_by(1 + d.len() / 64).chain([d.len() - TAG_BYTES - 1, d.len() - 1]) {
                let mut bad = d.clone();
                bad[i] ^= 1;
                assert_eq!(FrameMac::new(&k1).open(&bad, LINK), Err(Forged::BadTag), "bit flipped in byte {i} of {}", d.len());
            }
            // A trailer cut off (or a wide frame cut to a short one) is no frame.
            assert_eq!(FrameMac::new(&k1).open(&d[..d.len() - 1], LINK), Err(Forged::BadTag));
        }
        let mut d = b"frame bytes".to_vec();
        FrameMac::new(&k1).seal(&mut d, 0, LINK, 1);
        assert_eq!(FrameMac::new(&k1).open(&d[..TRAILER_BYTES - 1], LINK), Err(Forged::Short));
    }

    /// Copies sealed one after another reuse the tail's hash only when their tails are the
    /// same bytes: every tag equals a fresh seal's.
    #[test]
    fn sealing_copies_reuses_a_tail_hash_only_for_the_same_tail() {
        let mac = FrameMac::new(&random_key());
        let head = 300;
        let frame: Vec<u8> = (0..WIDE_FRAME_BYTES + head).map(|i| (i * 7) as u8).collect();
        let (mut buf, mut last) = (vec![], None);
        let mut copies = vec![];
        for (seq, change) in [None, Some(3), Some(head - 1), Some(head), None, Some(frame.len() - 1)].into_iter().enumerate() {
            let mut f = frame.clone();
            if let Some(i) = change {
                f[i] ^= 0x80;
            }
            let start = buf.len();
            buf.extend_from_slice(&f);
            let link = Link { from: ANY, to: seq as u32 };
            mac.seal_reusing(&mut buf, start, link, seq as u64, &mut last);
            let mut fresh = f.clone();
            mac.seal(&mut fresh, 0, link, seq as u64);
            assert_eq!(&buf[start..], &fresh[..], "frame changed at {change:?}");
            copies.push(fresh);
        }
        assert_ne!(copies[0], copies[1]);
        assert_ne!(copies[2], copies[3], "a change past the head changes the tag");
        // A shorter frame after a longer one (a different tail) is hashed afresh.
        for len in [WIDE_FRAME_BYTES, WIDE_FRAME_BYTES + 1] {
            let start = buf.len();
            buf.extend_from_slice(&frame[..len]);
            mac.seal_reusing(&mut buf, start, LINK, 9, &mut last);
            assert_eq!(mac.open(&buf[start..], LINK), Ok((&frame[..len], 9)));
        }
    }

    #[test]
    fn a_window_accepts_each_number_once_in_any_order_and_refuses_what_it_slid_past() {
        let mut w = ReplayWindow::default();
        let start = first_seq();
        assert_eq!(w.accept(start + 10), Ok(()));
        assert_eq!(w.accept(start + 10), Err(Replay::Replayed));
        // Behind the newest, out of order: accepted once each.
        for s in [start + 3, start + 9, start] {
            assert_eq!(w.accept(s), Ok(()));
            assert_eq!(w.accept(s), Err(Replay::Replayed));
        }
        // Jumps ahead by less and by more than the window.
        assert_eq!(w.accept(start + 10 + REPLAY_WINDOW - 1), Ok(()));
        assert_eq!(w.accept(start + 9), Err(Replay::Stale), "one past the window's end");
        assert_eq!(w.accept(start + 11), Ok(()), "a number inside the window never seen");
        assert_eq!(w.accept(start + 10 + REPLAY_WINDOW), Ok(()));
        assert_eq!(w.accept(start + 10 + REPLAY_WINDOW), Err(Replay::Replayed));
        // The slot start + 10 + W aliases start + 10's: cleared when the window slid, so the
        // new number was accepted; the old one is stale now.
        assert_eq!(w.accept(start + 10), Err(Replay::Stale));
        let far = start + 50 * REPLAY_WINDOW;
        assert_eq!(w.accept(far), Ok(()));
        for s in far - REPLAY_WINDOW + 1..far {
            assert_eq!(w.accept(s), Ok(()), "a jump clears the whole window ({})", far - s);
        }
        assert_eq!(w.accept(far - REPLAY_WINDOW), Err(Replay::Stale));
        // Every number of a window-wide run is marked exactly once.
        assert!((far - REPLAY_WINDOW + 1..=far).all(|s| w.accept(s) == Err(Replay::Replayed)));
    }

    #[test]
    fn keys_round_trip_through_hex_and_bad_hex_is_named() {
        let k = random_key();
        assert_eq!(key_from_hex(&key_to_hex(&k)), Ok(k));
        assert!(key_from_hex("00").unwrap_err().contains("64 hex digits"));
        assert!(key_from_hex(&"zz".repeat(32)).is_err());
        assert_ne!(random_key(), random_key());
    }
}

// ---- control plane ------------------------------------------------------------------------

/// The roles a control connection authenticates as; each has its own key derived from the
/// deployment secret, and may send only its role's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Worker,
    Ps,
    Switch,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Ps => "ps",
            Role::Switch => "switch",
        }
    }

    pub fn from_name(s: &str) -> Option<Role> {
        [Role::Worker, Role::Ps, Role::Switch].into_iter().find(|r| r.name() == s)
    }
}

/// Environment variable holding the deployment secret as 64 hex digits.
pub const SECRET_ENV: &str = "INALAB_SECRET";
/// Environment variable naming the secret's file (default `~/.config/inalab/secret`).
pub const SECRET_FILE_ENV: &str = "INALAB_SECRET_FILE";

/// The deployment secret every switch, PS and worker of one deployment shares: from
/// `INALAB_SECRET`, else from the file `INALAB_SECRET_FILE` names, else from
/// `$XDG_CONFIG_HOME/inalab/secret` (`~/.config/inalab/secret`). A missing file is created with
/// a fresh random secret, readable by its owner only (mode 0600), so processes of one user on
/// one machine agree without set-up; copy the file (or set the variable) on other machines.
#[derive(Clone)]
pub struct Secret([u8; KEY_BYTES]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn from_bytes(b: [u8; KEY_BYTES]) -> Secret {
        Secret(b)
    }

    pub fn load() -> Result<Secret, String> {
        if let Ok(hex) = std::env::var(SECRET_ENV) {
            return key_from_hex(hex.trim()).map(Secret).map_err(|e| format!("{SECRET_ENV}: {e}"));
        }
        let path = match std::env::var_os(SECRET_FILE_ENV) {
            Some(p) => std::path::PathBuf::from(p),
            None => {
                let base = std::env::var_os("XDG_CONFIG_HOME")
                    .map(std::path::PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".config")))
                    .ok_or_else(|| format!("no deployment secret: set {SECRET_ENV} or {SECRET_FILE_ENV} (neither HOME nor XDG_CONFIG_HOME is set)"))?;
                base.join("inalab").join("secret")
            }
        };
        Self::from_file(&path)
    }

    /// Reads the secret in `path`, creating it first if it does not exist.
    pub fn from_file(path: &std::path::Path) -> Result<Secret, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let read = |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("deployment secret {}: {e}", p.display()));
        if !path.exists() {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("deployment secret: creating {}: {e}", dir.display()))?;
            }
            // Written whole to a private temporary file, then linked into place only if no other
            // process got there first: readers never see half a secret.
            // Named per call, not per process: two threads of one process (two switches in a
            // test) creating the secret at once collided on a per-process name ("File exists").
            let tmp = path.with_extension(format!("tmp{}-{}", std::process::id(), &key_to_hex(&random_key())[..16]));
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(|e| format!("deployment secret {}: {e}", tmp.display()))?;
            std::io::Write::write_all(&mut f, format!("{}\n", key_to_hex(&random_key())).as_bytes()).map_err(|e| e.to_string())?;
            drop(f);
            let _ = std::fs::hard_link(&tmp, path);
            let _ = std::fs::remove_file(&tmp);
        }
        key_from_hex(read(path)?.trim()).map(Secret).map_err(|e| format!("deployment secret {}: {e}", path.display()))
    }

    /// What a party of `role` proves itself with.
    pub fn credential(&self, role: Role) -> Credential {
        Credential { role, key: self.role_key(role) }
    }

    /// The key of `role`: HMAC-SHA256(secret, "inalab role " + name).
    pub fn role_key(&self, role: Role) -> [u8; KEY_BYTES] {
        self.role_key_for_label(role.name())
    }

    /// HMAC-SHA256(secret, "inalab role " + label).
    pub fn role_key_for_label(&self, label: &str) -> [u8; KEY_BYTES] {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        m.update(b"inalab role ");
        m.update(label.as_bytes());
        m.finalize().into_bytes().into()
    }
}

/// Environment variable holding a worker's role key alone (64 hex digits, from `inalab secret
/// --worker-key`): a worker given only this can join jobs but cannot act as a switch or PS.
pub const WORKER_KEY_ENV: &str = "INALAB_WORKER_KEY";

/// A role and its key: what a connection authenticates with.
#[derive(Clone)]
pub struct Credential {
    pub role: Role,
    pub key: [u8; KEY_BYTES],
}

impl Credential {
    /// A worker's: `INALAB_WORKER_KEY` if set, else derived from the deployment secret.
    pub fn worker() -> Result<Credential, String> {
        match std::env::var(WORKER_KEY_ENV) {
            Ok(hex) => key_from_hex(hex.trim()).map(|key| Credential { role: Role::Worker, key }).map_err(|e| format!("{WORKER_KEY_ENV}: {e}")),
            Err(_) => Secret::load().map(|s| s.credential(Role::Worker)),
        }
    }
}

/// Proof of `role`'s key over both nonces, `who` telling the two directions apart.
pub fn proof(key: &[u8; KEY_BYTES], who: &str, server_nonce: &str, client_nonce: &str, role: Role) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for part in [who, server_nonce, client_nonce, role.name()] {
        m.update(part.as_bytes());
        m.update(&[0]);
    }
    key_to_hex(&m.finalize().into_bytes().into())
}

/// Constant-time comparison of two proofs.
pub fn proofs_match(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh nonce, hex.
pub fn nonce() -> String {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).expect("the operating system's random source");
    n.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod control_tests {
    use super::*;

    #[test]
    fn role_keys_differ_and_proofs_bind_role_nonces_and_direction() {
        let s = Secret::from_bytes([7; KEY_BYTES]);
        let (kw, ks) = (s.role_key(Role::Worker), s.role_key(Role::Switch));
        assert_ne!(kw, ks);
        let p = proof(&kw, "client", "aa", "bb", Role::Worker);
        assert!(proofs_match(&p, &proof(&kw, "client", "aa", "bb", Role::Worker)));
        for other in [proof(&ks, "client", "aa", "bb", Role::Worker), proof(&kw, "server", "aa", "bb", Role::Worker),
                      proof(&kw, "client", "ab", "bb", Role::Worker), proof(&kw, "client", "aa", "bb", Role::Switch)] {
            assert!(!proofs_match(&p, &other));
        }
    }

    #[test]
    fn a_secret_file_is_created_private_once_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("inalab-secret-test-{}", std::process::id()));
        let path = dir.join("sub").join("secret");
        let a = Secret::from_file(&path).unwrap();
        let b = Secret::from_file(&path).unwrap();
        assert_eq!(a.0, b.0);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "not hex").unwrap();
        assert!(Secret::from_file(&path).unwrap_err().contains("64 hex digits"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn threads_creating_the_secret_at_once_all_read_the_same_one() {
        let dir = std::env::temp_dir().join(format!("inalab-secret-race-{}", std::process::id()));
        for round in 0..20 {
            let path = dir.join(format!("secret{round}"));
            let keys: Vec<[u8; KEY_BYTES]> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..8).map(|_| s.spawn(|| Secret::from_file(&path).map(|k| k.0))).collect();
                hs.into_iter().map(|h| h.join().unwrap().expect("every thread reads the secret")).collect()
            });
            assert!(keys.windows(2).all(|w| w[0] == w[1]), "one secret for all");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
