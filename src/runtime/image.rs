//! Module images checked before `cuModuleLoadData` sees them.
//!
//! The driver takes no length: it trusts the image's own headers. So every range a cubin (ELF64)
//! or fatbin declares is checked against the bytes the caller gave; anything else must be PTX
//! text, which the driver reads up to a NUL.

use crate::error::{Error, Result};

const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

const ELF_HEADER_SIZE: u16 = 64;
const PHDR_SIZE: u16 = 56;
const SHDR_SIZE: u16 = 64;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
const EV_CURRENT: u8 = 1;
const SHT_NOBITS: u32 = 8;
const PN_XNUM: u16 = 0xffff;

/// Minimum header sizes: the fatbin's outer header; an entry's header, which the driver reads at
/// 64 bytes whatever it declares (a shorter one would have it read fields from the payload).
const FATBIN_HEADER_MIN: u16 = 16;
const ENTRY_HEADER_MIN: u32 = 64;
/// A compressed entry's compressed length (u32 at offset 16 of its header): what the
/// decompressor reads, so it must lie within the payload.
const ENTRY_COMPRESSED_SIZE_AT: usize = 16;
/// Host-side fatbin wrappers (`__fatBinC_Wrapper_t`, magic 0x466243B1, and the legacy
/// `__cudaFatCudaBinary`, 0x1EE55A01): they hold host *pointers* the driver would follow.
const WRAPPER_MAGICS: [u32; 2] = [0x4662_43B1, 0x1EE5_5A01];
/// An entry's flags (u64 at offset 40 of its header).
const ENTRY_FLAGS_AT: usize = 40;
/// Flags of a compressed payload: 0x2000 (older, LZ-style) and 0x8000 (zstd, CUDA 12.8+).
const ENTRY_COMPRESSED: u64 = 0x2000 | 0x8000;

/// Zero words after the copied image.
const TAIL_WORDS: usize = 8;

/// Checks the image and copies it into an 8-byte aligned, NUL-terminated buffer, so the driver
/// never reads past what the caller gave.
pub(crate) fn prepare_image(image: &[u8]) -> Result<Vec<u64>> {
    validate(image)?;
    // Copy, with at least 64 trailing zero bytes: PTX must be NUL-terminated, and a fatbin entry
    // header the driver reads at its full size (64 bytes) stays inside the buffer even when the
    // image declares a shorter one at its very end.
    let mut out = vec![0u64; image.len() / 8 + 1 + TAIL_WORDS];
    // SAFETY: `out` holds at least `image.len() + 1` bytes; the regions do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(image.as_ptr(), out.as_mut_ptr().cast::<u8>(), image.len())
    };
    Ok(out)
}

/// Checks an image: an ELF64 cubin or a fatbin in full, anything else as PTX text (text up to its
/// first NUL; the copy's trailing NUL ends it). Host-side fatbin wrappers are refused.
fn validate(image: &[u8]) -> Result<()> {
    if image.is_empty() {
        return Err(Error::InvalidArgument("the module image is empty".into()));
    }
    if image.starts_with(&ELF_MAGIC) {
        check_elf(image, "image")
            .map_err(|m| Error::InvalidArgument(format!("the module image is a corrupt ELF: {m}")))
    } else if read_u32(image, 0) == Some(FATBIN_MAGIC) {
        check_fatbins(image).map_err(|m| {
            Error::InvalidArgument(format!("the module image is a corrupt fatbin: {m}"))
        })
    } else if let Some(magic) = read_u32(image, 0).filter(|m| WRAPPER_MAGICS.contains(m)) {
        Err(Error::InvalidArgument(format!(
            "the module image is a host-side fatbin wrapper (magic {magic:#010x}), which points at              memory elsewhere: pass the fatbin itself (magic 0xBA55ED50)"
        )))
    } else {
        check_ptx(image).map_err(|m| {
            Error::InvalidArgument(format!(
                "the module image is neither an ELF cubin, a fatbin nor PTX text: {m}"
            ))
        })
    }
}

/// [`check_ptx`] as the crate's error, for PTX text handed in as such (`Device::load_ptx`).
pub(crate) fn check_ptx_text(text: &[u8]) -> Result<()> {
    check_ptx(text).map_err(|m| Error::InvalidArgument(format!("the PTX text is not text: {m}")))
}

/// PTX is text: up to its first NUL (where the driver stops reading), UTF-8 with no control
/// characters but tabs and line ends. Anything else is some binary format the driver might
/// parse without a length.
fn check_ptx(image: &[u8]) -> std::result::Result<(), String> {
    let text = image.split(|&c| c == 0).next().unwrap_or_default();
    let text = std::str::from_utf8(text).map_err(|e| {
        format!(
            "the bytes before the first NUL are not UTF-8 text (at offset {})",
            e.valid_up_to()
        )
    })?;
    match text
        .char_indices()
        .find(|&(_, c)| c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c'))
    {
        Some((at, c)) => Err(format!(
            "control character {:#04x} at offset {at} before the first NUL",
            u32::from(c)
        )),
        None => Ok(()),
    }
}

fn read<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}
fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    read(b, at).map(u16::from_le_bytes)
}
fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    read(b, at).map(u32::from_le_bytes)
}
fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    read(b, at).map(u64::from_le_bytes)
}

/// `b[offset..offset + size]`, or `None` if any of it lies outside `b` (or overflows).
fn range(b: &[u8], offset: u64, size: u64) -> Option<&[u8]> {
    let start = usize::try_from(offset).ok()?;
    let end = start.checked_add(usize::try_from(size).ok()?)?;
    b.get(start..end)
}

fn fits(b: &[u8], offset: u64, size: u64) -> bool {
    range(b, offset, size).is_some()
}

/// The ELF64 header fields the checks use.
struct ElfHeader {
    phoff: u64,
    shoff: u64,
    ehsize: u16,
    phentsize: u16,
    phnum: u16,
    shentsize: u16,
    shnum: u16,
    shstrndx: u16,
}

impl ElfHeader {
    fn read(b: &[u8]) -> Option<Self> {
        Some(Self {
            phoff: read_u64(b, 0x20)?,
            shoff: read_u64(b, 0x28)?,
            ehsize: read_u16(b, 0x34)?,
            phentsize: read_u16(b, 0x36)?,
            phnum: read_u16(b, 0x38)?,
            shentsize: read_u16(b, 0x3a)?,
            shnum: read_u16(b, 0x3c)?,
            shstrndx: read_u16(b, 0x3e)?,
        })
    }
}

/// Checks an ELF64 little-endian image `b`; `whole` names it in messages ("image", "payload").
/// Returns what is wrong, without the "corrupt ELF" prefix.
fn check_elf(b: &[u8], whole: &str) -> std::result::Result<(), String> {
    let len = b.len();
    let past_end = |what: String| format!("{what} lies past the end of the {len}-byte {whole}");
    let h = match ElfHeader::read(b) {
        Some(h) if len >= usize::from(ELF_HEADER_SIZE) => h,
        _ => {
            return Err(format!(
                "the {len}-byte {whole} is shorter than the 64-byte ELF64 header"
            ))
        }
    };
    // The header is 64 bytes long, so these are there.
    let ident = |i: usize| b.get(i).copied().unwrap_or_default();
    let (class, data, version) = (ident(4), ident(5), ident(6));
    if class != ELFCLASS64 {
        return Err(format!(
            "its class (EI_CLASS) is {class}, not ELFCLASS64 (2): cubins are 64-bit"
        ));
    }
    if data != ELFDATA2LSB {
        return Err(format!(
            "its data encoding (EI_DATA) is {data}, not little-endian ELFDATA2LSB (1)"
        ));
    }
    if version != EV_CURRENT {
        return Err(format!(
            "its ELF version (EI_VERSION) is {version}, not EV_CURRENT (1)"
        ));
    }
    if h.ehsize < ELF_HEADER_SIZE {
        return Err(format!(
            "e_ehsize is {}, less than the 64-byte ELF64 header",
            h.ehsize
        ));
    }
    if usize::from(h.ehsize) > len {
        return Err(past_end(format!(
            "the {}-byte ELF header (e_ehsize)",
            h.ehsize
        )));
    }

    // Program headers.
    if h.phnum == PN_XNUM {
        let msg = "e_phnum is PN_XNUM (0xffff): extended program header numbering is not \
                   supported (cubins do not use it)";
        return Err(msg.into());
    }
    let mut phdrs: &[u8] = &[];
    if h.phnum > 0 {
        if h.phentsize != PHDR_SIZE {
            return Err(format!(
                "e_phentsize is {}, not the 56 bytes of an ELF64 program header",
                h.phentsize
            ));
        }
        let size = u64::from(h.phnum) * u64::from(PHDR_SIZE);
        phdrs = range(b, h.phoff, size).ok_or_else(|| {
            past_end(format!(
                "the program header table (offset {}, {} entries of 56 bytes)",
                h.phoff, h.phnum
            ))
        })?;
    }

    // Section headers.
    let mut shdrs: &[u8] = &[];
    if h.shnum == 0 {
        if h.shoff != 0 {
            return Err(format!(
                "e_shnum is 0 but e_shoff is {}: extended section numbering is not supported \
                 (cubins do not use it)",
                h.shoff
            ));
        }
        if h.shstrndx != 0 {
            return Err(format!(
                "there are no sections but e_shstrndx is {}, not SHN_UNDEF (0)",
                h.shstrndx
            ));
        }
    } else {
        if h.shentsize != SHDR_SIZE {
            return Err(format!(
                "e_shentsize is {}, not the 64 bytes of an ELF64 section header",
                h.shentsize
            ));
        }
        let size = u64::from(h.shnum) * u64::from(SHDR_SIZE);
        shdrs = range(b, h.shoff, size).ok_or_else(|| {
            past_end(format!(
                "the section header table (offset {}, {} entries of 64 bytes)",
                h.shoff, h.shnum
            ))
        })?;
        if h.shstrndx >= h.shnum {
            return Err(format!(
                "e_shstrndx is {} but there are only {} sections",
                h.shstrndx, h.shnum
            ));
        }
    }

    let sections: Vec<SectionHeader> = shdrs
        .chunks_exact(usize::from(SHDR_SIZE))
        .map(SectionHeader::read)
        .collect::<Option<_>>()
        .ok_or("a section header could not be read")?;
    for (i, s) in sections.iter().enumerate() {
        // SHT_NOBITS (.bss-like) sections occupy no bytes of the file.
        if s.kind != SHT_NOBITS && !fits(b, s.offset, s.size) {
            return Err(past_end(format!(
                "section {i} (offset {}, size {})",
                s.offset, s.size
            )));
        }
    }
    if let Some(names) = sections.get(usize::from(h.shstrndx)) {
        let n = h.shstrndx;
        if names.kind == SHT_NOBITS {
            return Err(format!(
                "the section-name string table (section {n}) is SHT_NOBITS: it has no bytes"
            ));
        }
        // Its range was checked above.
        let strtab = range(b, names.offset, names.size).unwrap_or_default();
        if strtab.last().is_some_and(|&c| c != 0) {
            return Err(format!(
                "the section-name string table (section {n}) does not end with a NUL, so a name \
                 could run past it"
            ));
        }
        for (i, s) in sections.iter().enumerate() {
            if u64::from(s.name) >= names.size {
                return Err(format!(
                    "section {i}'s name (sh_name {}) lies outside the {}-byte section-name \
                     string table (section {n})",
                    s.name, names.size
                ));
            }
        }
        check_tables(b, &sections, h.shnum)?;
    }

    for (i, ph) in phdrs.chunks_exact(usize::from(PHDR_SIZE)).enumerate() {
        let (Some(offset), Some(size)) = (read_u64(ph, 8), read_u64(ph, 0x20)) else {
            return Err("a program header could not be read".into());
        };
        if !fits(b, offset, size) {
            return Err(past_end(format!(
                "segment {i} (offset {offset}, file size {size})"
            )));
        }
    }
    Ok(())
}

/// The ELF64 section header fields the checks use.
struct SectionHeader {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
    info: u32,
    entsize: u64,
}

impl SectionHeader {
    fn read(sh: &[u8]) -> Option<Self> {
        Some(Self {
            name: read_u32(sh, 0)?,
            kind: read_u32(sh, 4)?,
            offset: read_u64(sh, 0x18)?,
            size: read_u64(sh, 0x20)?,
            link: read_u32(sh, 0x28)?,
            info: read_u32(sh, 0x2c)?,
            entsize: read_u64(sh, 0x38)?,
        })
    }
}

const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_RELA: u32 = 4;
const SHT_DYNSYM: u32 = 11;
const SHT_REL: u32 = 9;
const SYM_SIZE: u64 = 24;
/// Section indices from here up are reserved (SHN_ABS, SHN_COMMON, SHN_XINDEX, ...).
const SHN_LORESERVE: u16 = 0xff00;

/// The indices the loader follows inside the tables (section ranges are checked already):
/// every section's `sh_link` is a section; a symbol table's entries are 24 bytes, link to a
/// string table, and each symbol's name lies inside it and its section index is a section (or
/// reserved); a relocation table's entries are 24 (`RELA`) or 16 (`REL`) bytes, it links to a
/// symbol table, applies to a section with bytes in the file, and each entry names a symbol of
/// that table and a place inside that section. The tables checked entry by entry may not add up
/// to more than the image: in a well-formed file they do not overlap, and a crafted one whose
/// thousands of headers all name one large table would otherwise take time quadratic in its size.
fn check_tables(b: &[u8], all: &[SectionHeader], shnum: u16) -> std::result::Result<(), String> {
    let bytes = |s: &SectionHeader| range(b, s.offset, s.size).unwrap_or_default();
    let mut scanned: u64 = 0;
    let mut scan = |i: usize, s: &SectionHeader| {
        scanned = scanned.saturating_add(s.size);
        if scanned > b.len() as u64 {
            return Err(format!(
                "the symbol and relocation tables up to section {i} add up to more than the \
                 {}-byte image: sections overlap",
                b.len()
            ));
        }
        Ok(())
    };
    for (i, s) in all.iter().enumerate() {
        if s.link >= u32::from(shnum) {
            return Err(format!(
                "section {i} links to section {} (sh_link), but there are only {shnum}",
                s.link
            ));
        }
        let linked = &all[s.link as usize];
        match s.kind {
            SHT_SYMTAB | SHT_DYNSYM => {
                if s.entsize != SYM_SIZE || s.size % SYM_SIZE != 0 {
                    return Err(format!(
                        "symbol table (section {i}) has {}-byte entries over {} bytes, not \
                         24-byte ELF64 symbols",
                        s.entsize, s.size
                    ));
                }
                if linked.kind != SHT_STRTAB {
                    return Err(format!(
                        "symbol table (section {i}) links to section {}, which is not a string \
                         table",
                        s.link
                    ));
                }
                scan(i, s)?;
                let count = s.size / SYM_SIZE;
                if u64::from(s.info) > count {
                    return Err(format!(
                        "symbol table (section {i}) says {} local symbols (sh_info) of {count}",
                        s.info
                    ));
                }
                let names = bytes(linked);
                if names.last().is_some_and(|&c| c != 0) {
                    return Err(format!(
                        "the string table (section {}) of symbol table {i} does not end with a \
                         NUL",
                        s.link
                    ));
                }
                for (k, sym) in bytes(s).chunks_exact(SYM_SIZE as usize).enumerate() {
                    let (name, shndx) = (
                        read_u32(sym, 0).unwrap_or(u32::MAX),
                        read_u16(sym, 6).unwrap_or(u16::MAX),
                    );
                    if u64::from(name) >= names.len() as u64 && !(name == 0 && names.is_empty()) {
                        return Err(format!(
                            "symbol {k} of section {i} is named at offset {name}, outside its \
                             {}-byte string table",
                            names.len()
                        ));
                    }
                    if shndx >= shnum && shndx < SHN_LORESERVE {
                        return Err(format!(
                            "symbol {k} of section {i} is in section {shndx}, but there are only \
                             {shnum}"
                        ));
                    }
                }
            }
            SHT_RELA | SHT_REL => {
                let entry = if s.kind == SHT_RELA { 24 } else { 16 };
                if s.entsize != entry || s.size % entry != 0 {
                    return Err(format!(
                        "relocation table (section {i}) has {}-byte entries over {} bytes, not \
                         {entry}-byte ELF64 relocations",
                        s.entsize, s.size
                    ));
                }
                if !matches!(linked.kind, SHT_SYMTAB | SHT_DYNSYM) {
                    return Err(format!(
                        "relocation table (section {i}) links to section {}, which is not a \
                         symbol table",
                        s.link
                    ));
                }
                if s.info >= u32::from(shnum) {
                    return Err(format!(
                        "relocation table (section {i}) applies to section {} (sh_info), but \
                         there are only {shnum}",
                        s.info
                    ));
                }
                let target = &all[s.info as usize];
                if target.kind == SHT_NOBITS && s.size > 0 {
                    return Err(format!(
                        "relocation table (section {i}) applies to section {}, which has no \
                         bytes in the file (SHT_NOBITS)",
                        s.info
                    ));
                }
                scan(i, s)?;
                let symbols = linked.size / SYM_SIZE;
                for (k, rel) in bytes(s).chunks_exact(entry as usize).enumerate() {
                    let symbol = read_u64(rel, 8).unwrap_or(u64::MAX) >> 32;
                    if symbol >= symbols {
                        return Err(format!(
                            "relocation {k} of section {i} names symbol {symbol}, but its symbol \
                             table has {symbols}"
                        ));
                    }
                    // Where the loader patches: it must lie inside the section patched.
                    let at = read_u64(rel, 0).unwrap_or(u64::MAX);
                    if at >= target.size {
                        return Err(format!(
                            "relocation {k} of section {i} patches offset {at} of section {}, \
                             which is {} bytes long",
                            s.info, target.size
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a sequence of fatbins filling `b` (zero padding may follow each).
fn check_fatbins(b: &[u8]) -> std::result::Result<(), String> {
    let (mut start, mut index) = (0, 0);
    loop {
        let end = check_fatbin(b, start, index)?;
        let rest = b.get(end..).unwrap_or_default();
        match rest.iter().position(|&c| c != 0) {
            None => return Ok(()),
            Some(skip) => start = end + skip,
        }
        if read_u32(b, start) != Some(FATBIN_MAGIC) {
            return Err(format!(
                "the bytes at offset {start}, after fatbin {index}, are neither zero padding nor \
                 another fatbin (magic 0xBA55ED50)"
            ));
        }
        index += 1;
    }
}

/// Checks the fatbin at `start` (number `index`) and every entry in it; returns where it ends.
fn check_fatbin(b: &[u8], start: usize, index: usize) -> std::result::Result<usize, String> {
    let len = b.len();
    let name = format!("fatbin {index} (at offset {start})");
    let (Some(header_size), Some(fat_size)) = (
        read_u16(b, start.saturating_add(6)),
        read_u64(b, start.saturating_add(8)),
    ) else {
        return Err(format!(
            "{name}: its 16-byte header lies past the end of the {len}-byte image"
        ));
    };
    if header_size < FATBIN_HEADER_MIN {
        return Err(format!(
            "{name}: its header_size is {header_size}, less than the 16-byte fatbin header"
        ));
    }
    let first = start.checked_add(usize::from(header_size));
    let end = first
        .zip(usize::try_from(fat_size).ok())
        .and_then(|(first, size)| first.checked_add(size))
        .filter(|&end| end <= len);
    let (Some(mut at), Some(end)) = (first, end) else {
        return Err(format!(
            "{name}: its {header_size}-byte header and {fat_size} bytes of entries lie past \
             the end of the {len}-byte image"
        ));
    };
    let mut entry = 0;
    while at < end {
        let what = format!("entry {entry} (at offset {at}) of {name}");
        // `at < end <= len`, so the fatbin's bytes from `at` on are readable.
        let fat = b.get(at..end).unwrap_or_default();
        let (Some(kind), Some(entry_header), Some(payload_size)) =
            (read_u16(fat, 0), read_u32(fat, 4), read_u64(fat, 8))
        else {
            return Err(format!(
                "{what}: only {} bytes of the fatbin are left, less than a 16-byte entry header",
                end - at
            ));
        };
        if entry_header < ENTRY_HEADER_MIN {
            return Err(format!(
                "{what}: its header_size is {entry_header}, less than the 64 bytes the driver \
                 reads"
            ));
        }
        let Some(payload) = range(fat, u64::from(entry_header), payload_size) else {
            return Err(format!(
                "{what}: its {entry_header}-byte header and {payload_size}-byte payload lie past \
                 the end of the fatbin, at offset {end}"
            ));
        };
        // Only an uncompressed payload that starts like an ELF is parsed (by any kind: 2 is a
        // cubin); others (PTX, compressed) are opaque bytes inside the fatbin.
        let flags = read_u64(fat, ENTRY_FLAGS_AT).unwrap_or(0);
        if flags & ENTRY_COMPRESSED != 0 {
            // The decompressor reads this many bytes of the payload. (What it decompresses to is
            // not checked: a corrupt cubin inside a compressed entry reaches the driver.)
            let compressed = read_u32(fat, ENTRY_COMPRESSED_SIZE_AT).unwrap_or(u32::MAX);
            if u64::from(compressed) > payload_size {
                return Err(format!(
                    "{what}: its compressed size {compressed} is larger than its \
                     {payload_size}-byte payload"
                ));
            }
        } else if payload.starts_with(&ELF_MAGIC) {
            check_elf(payload, "payload")
                .map_err(|m| format!("{what} (kind {kind}) is a corrupt ELF: {m}"))?;
        }
        // The payload lies inside `fat`, so this stays at most `end`.
        at += usize::try_from(entry_header)
            .ok()
            .and_then(|h| h.checked_add(payload.len()))
            .unwrap_or(end - at);
        entry += 1;
    }
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHIPPED: &[u8] = include_bytes!("../../tests/kernels/kernels.fatbin");

    fn put16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn put32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// The section-name string table: "", ".shstrtab", ".data", padded to 24 bytes.
    const STRTAB: &[u8; 24] = b"\0.shstrtab\0.data\0\0\0\0\0\0\0\0";
    const DATA_NAME: u32 = 11;

    /// A valid ELF64 cubin-like image and where its tables are.
    struct Elf {
        bytes: Vec<u8>,
        phoff: usize,
        shoff: usize,
    }

    impl Elf {
        fn sh(&self, i: usize, field: usize) -> usize {
            self.shoff + i * 64 + field
        }
        fn ph(&self, i: usize, field: usize) -> usize {
            self.phoff + i * 56 + field
        }
    }

    /// Header | string table | 16 data bytes per section past the first two | program headers |
    /// section headers. Sections: NULL, .shstrtab, then `.data`s; every segment covers the
    /// string table. `sections` is 0 (no section table) or at least 2.
    fn elf(sections: usize, segments: usize) -> Elf {
        assert!(sections == 0 || sections >= 2);
        let data = 64 + STRTAB.len();
        let phoff = data + sections.saturating_sub(2) * 16;
        let shoff = phoff + segments * 56;
        let mut b = vec![0u8; shoff + sections * 64];
        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4..7].copy_from_slice(&[ELFCLASS64, ELFDATA2LSB, EV_CURRENT]);
        put16(&mut b, 0x10, 2); // ET_EXEC
        put16(&mut b, 0x12, 190); // EM_CUDA
        put32(&mut b, 0x14, 1);
        put16(&mut b, 0x34, 64);
        if segments > 0 {
            put64(&mut b, 0x20, phoff as u64);
            put16(&mut b, 0x36, 56);
            put16(&mut b, 0x38, segments as u16);
        }
        if sections > 0 {
            put64(&mut b, 0x28, shoff as u64);
            put16(&mut b, 0x3a, 64);
            put16(&mut b, 0x3c, sections as u16);
            put16(&mut b, 0x3e, 1);
        }
        b[64..data].copy_from_slice(STRTAB);
        for i in 0..segments {
            let ph = phoff + i * 56;
            put32(&mut b, ph, 1); // PT_LOAD
            put64(&mut b, ph + 8, 64);
            put64(&mut b, ph + 0x20, STRTAB.len() as u64);
            put64(&mut b, ph + 0x28, STRTAB.len() as u64);
        }
        for i in 1..sections {
            let sh = shoff + i * 64;
            let (name, kind, offset, size) = if i == 1 {
                (1, 3, 64, STRTAB.len()) // SHT_STRTAB
            } else {
                (DATA_NAME, 1, data + (i - 2) * 16, 16) // SHT_PROGBITS
            };
            put32(&mut b, sh, name);
            put32(&mut b, sh + 4, kind);
            put64(&mut b, sh + 0x18, offset as u64);
            put64(&mut b, sh + 0x20, size as u64);
        }
        Elf {
            bytes: b,
            phoff,
            shoff,
        }
    }

    /// `elf(4, 0)` with section 2 a symbol table (two symbols; symbol 1 named ".shstrtab", in
    /// section 2; linked to the section-name string table) and section 3 a `RELA` table with one
    /// relocation naming symbol 1 and applying to section 2; the tables appended after the
    /// section headers. Returns the image and the offsets of symbol 1 and the relocation.
    fn elf_with_symbols() -> (Vec<u8>, usize, usize) {
        let e = elf(4, 0);
        let mut b = e.bytes.clone();
        let symtab = b.len();
        b.resize(symtab + 48, 0);
        let sym1 = symtab + 24;
        put32(&mut b, sym1, 1);
        put16(&mut b, sym1 + 6, 2);
        let rela = b.len();
        b.resize(rela + 24, 0);
        put64(&mut b, rela + 8, (1 << 32) | 1);
        let sh = |i: usize, field: usize| e.sh(i, field);
        put32(&mut b, sh(2, 4), 2); // SHT_SYMTAB
        put64(&mut b, sh(2, 0x18), symtab as u64);
        put64(&mut b, sh(2, 0x20), 48);
        put32(&mut b, sh(2, 0x28), 1);
        put32(&mut b, sh(2, 0x2c), 1);
        put64(&mut b, sh(2, 0x38), 24);
        put32(&mut b, sh(3, 4), 4); // SHT_RELA
        put64(&mut b, sh(3, 0x18), rela as u64);
        put64(&mut b, sh(3, 0x20), 24);
        put32(&mut b, sh(3, 0x28), 2);
        put32(&mut b, sh(3, 0x2c), 2);
        put64(&mut b, sh(3, 0x38), 24);
        (b, sym1, rela)
    }

    #[test]
    fn symbol_and_relocation_tables_are_checked() {
        let (ok, sym1, rela) = elf_with_symbols();
        assert!(validate(&ok).is_ok(), "{:?}", validate(&ok));
        let shoff = elf(4, 0).shoff;
        let with = |at: usize, v: u64, width: usize| {
            let mut b = ok.clone();
            match width {
                2 => put16(&mut b, at, v as u16),
                4 => put32(&mut b, at, v as u32),
                _ => put64(&mut b, at, v),
            }
            b
        };
        rejected_with(
            &with(sym1, 1000, 4),
            "symbol 1 of section 2 is named at offset 1000",
        );
        rejected_with(
            &with(sym1 + 6, 50, 2),
            "symbol 1 of section 2 is in section 50",
        );
        assert!(
            validate(&with(sym1 + 6, 0xfff1, 2)).is_ok(),
            "SHN_ABS is reserved, not a section"
        );
        rejected_with(
            &with(shoff + 2 * 64 + 0x28, 9, 4),
            "section 2 links to section 9",
        );
        rejected_with(
            &with(shoff + 2 * 64 + 0x28, 3, 4),
            "which is not a string table",
        );
        rejected_with(
            &with(shoff + 2 * 64 + 0x38, 16, 8),
            "not 24-byte ELF64 symbols",
        );
        rejected_with(&with(shoff + 2 * 64 + 0x2c, 3, 4), "says 3 local symbols");
        rejected_with(
            &with(rela + 8, (5 << 32) | 1, 8),
            "relocation 0 of section 3 names symbol 5",
        );
        rejected_with(
            &with(shoff + 3 * 64 + 0x28, 1, 4),
            "which is not a symbol table",
        );
        rejected_with(&with(shoff + 3 * 64 + 0x2c, 7, 4), "applies to section 7");
        rejected_with(
            &with(rela, 48, 8),
            "relocation 0 of section 3 patches offset 48 of section 2, which is 48 bytes long",
        );
        rejected_with(
            &with(rela, u64::MAX / 2, 8),
            "relocation 0 of section 3 patches offset",
        );
        rejected_with(
            &with(shoff + 3 * 64 + 0x2c, 0, 4),
            "patches offset 0 of section 0, which is 0 bytes long",
        );
        assert!(
            validate(&with(rela, 47, 8)).is_ok(),
            "the last byte is inside"
        );
    }

    #[test]
    fn relocations_into_a_section_without_file_bytes_are_rejected() {
        let (ok, _, _) = elf_with_symbols();
        let shoff = elf(4, 0).shoff;
        let mut b = ok.clone();
        // Patching another section with bytes (the names) is accepted.
        put32(&mut b, shoff + 3 * 64 + 0x2c, 1);
        assert!(validate(&b).is_ok(), "{:?}", validate(&b));
        let mut nobits = elf(5, 0);
        let at = nobits.sh(4, 4);
        put32(&mut nobits.bytes, at, 8); // SHT_NOBITS
        let base = nobits.bytes.len();
        nobits.bytes.resize(base + 48 + 24, 0);
        let (symtab, rela) = (base, base + 48);
        put32(&mut nobits.bytes, symtab + 24, 1);
        put64(&mut nobits.bytes, rela + 8, (1 << 32) | 1);
        let sh = |i: usize, field: usize| nobits.sh(i, field);
        let (sym_kind, sym_off, sym_size, sym_link, sym_ent) =
            (sh(2, 4), sh(2, 0x18), sh(2, 0x20), sh(2, 0x28), sh(2, 0x38));
        let (rel_kind, rel_off, rel_size, rel_link, rel_info, rel_ent) = (
            sh(3, 4),
            sh(3, 0x18),
            sh(3, 0x20),
            sh(3, 0x28),
            sh(3, 0x2c),
            sh(3, 0x38),
        );
        let b = &mut nobits.bytes;
        put32(b, sym_kind, 2);
        put64(b, sym_off, symtab as u64);
        put64(b, sym_size, 48);
        put32(b, sym_link, 1);
        put64(b, sym_ent, 24);
        put32(b, rel_kind, 4);
        put64(b, rel_off, rela as u64);
        put64(b, rel_size, 24);
        put32(b, rel_link, 2);
        put32(b, rel_info, 2);
        put64(b, rel_ent, 24);
        assert!(validate(b).is_ok(), "{:?}", validate(b));
        put32(b, rel_info, 4);
        rejected_with(
            b,
            "applies to section 4, which has no bytes in the file (SHT_NOBITS)",
        );
    }

    #[test]
    fn tables_named_by_many_headers_are_rejected_not_scanned_each_time() {
        // 38 symbol tables over the same 4800 bytes: 182 400 bytes to scan in a ~8 KB image.
        let mut e = elf(40, 0);
        let table = e.bytes.len();
        e.bytes.resize(table + 4800, 0);
        for i in 2..40 {
            let b = &mut e.bytes;
            let sh = e.shoff + i * 64;
            put32(b, sh + 4, 2); // SHT_SYMTAB
            put64(b, sh + 0x18, table as u64);
            put64(b, sh + 0x20, 4800);
            put32(b, sh + 0x28, 1);
            put64(b, sh + 0x38, 24);
        }
        rejected_with(&e.bytes, "add up to more than the");
        // One of them alone is fine.
        let mut one = e.bytes.clone();
        for i in 3..40 {
            put32(&mut one, e.shoff + i * 64 + 4, 1); // SHT_PROGBITS
        }
        assert!(validate(&one).is_ok(), "{:?}", validate(&one));
    }

    const FLAGS_64BIT_LINUX: u64 = 0x11;

    /// A fatbin of `entries` (kind, flags, payload), each with a 64-byte header and its payload
    /// padded to 8 bytes.
    fn fatbin(entries: &[(u16, u64, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, flags, payload) in entries {
            let padded = payload.len().div_ceil(8) * 8;
            let mut h = [0u8; 64];
            put16(&mut h, 0, kind);
            put16(&mut h, 2, 0x0101);
            put32(&mut h, 4, 64);
            put64(&mut h, 8, padded as u64);
            put64(&mut h, 40, flags);
            body.extend_from_slice(&h);
            body.extend_from_slice(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut b = FATBIN_MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&16u16.to_le_bytes());
        b.extend_from_slice(&(body.len() as u64).to_le_bytes());
        b.extend_from_slice(&body);
        b
    }

    fn rejected(img: &[u8]) -> String {
        match validate(img) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[track_caller]
    fn rejected_with(img: &[u8], what: &str) {
        let m = rejected(img);
        assert!(m.contains(what), "{m:?} does not say {what:?}");
    }

    // Accepted images.

    #[test]
    fn valid_synthetic_elves_pass() {
        for (sections, segments) in [(0, 0), (0, 3), (2, 0), (2, 1), (5, 2), (40, 7)] {
            let e = elf(sections, segments);
            assert!(
                validate(&e.bytes).is_ok(),
                "{sections} sections, {segments} segments"
            );
        }
    }

    #[test]
    fn shipped_fatbin_passes() {
        assert!(validate(SHIPPED).is_ok());
        assert!(prepare_image(SHIPPED).is_ok());
    }

    #[test]
    fn ptx_text_is_copied_nul_terminated() {
        for img in [
            &b".version 8.0"[..],
            b".version 8.0\n\0",
            b"\0",
            b"12345678",
        ] {
            let out = prepare_image(img).unwrap();
            let bytes: Vec<u8> = out.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert_eq!(&bytes[..img.len()], img);
            assert_eq!(bytes[img.len()], 0);
        }
    }

    #[test]
    fn ptx_with_an_interior_nul_is_accepted() {
        assert!(validate(b".version 8.0\0garbage").is_ok());
    }

    #[test]
    fn empty_image_is_rejected() {
        assert_eq!(rejected(&[]), "the module image is empty");
    }

    // ELF rules, one test each.

    #[test]
    fn elf_shorter_than_its_header_is_rejected() {
        let e = elf(2, 1);
        rejected_with(
            &e.bytes[..40],
            "corrupt ELF: the 40-byte image is shorter than the 64-byte ELF64 header",
        );
    }

    #[test]
    fn elf32_is_rejected() {
        let mut e = elf(2, 1);
        e.bytes[4] = 1;
        rejected_with(&e.bytes, "its class (EI_CLASS) is 1, not ELFCLASS64");
    }

    #[test]
    fn big_endian_elf_is_rejected() {
        let mut e = elf(2, 1);
        e.bytes[5] = 2;
        rejected_with(&e.bytes, "not little-endian ELFDATA2LSB");
    }

    #[test]
    fn elf_ident_version_other_than_current_is_rejected() {
        let mut e = elf(2, 1);
        e.bytes[6] = 0;
        rejected_with(&e.bytes, "not EV_CURRENT");
    }

    #[test]
    fn elf_header_size_below_64_is_rejected() {
        let mut e = elf(2, 1);
        put16(&mut e.bytes, 0x34, 52);
        rejected_with(&e.bytes, "e_ehsize is 52");
    }

    #[test]
    fn elf_header_size_past_the_end_is_rejected() {
        let mut e = elf(2, 1);
        put16(&mut e.bytes, 0x34, 0xffff);
        rejected_with(
            &e.bytes,
            "the 65535-byte ELF header (e_ehsize) lies past the end",
        );
    }

    #[test]
    fn elf_program_header_entry_size_other_than_56_is_rejected() {
        let mut e = elf(2, 1);
        put16(&mut e.bytes, 0x36, 32);
        rejected_with(&e.bytes, "e_phentsize is 32");
    }

    #[test]
    fn elf_extended_program_header_count_is_rejected() {
        let mut e = elf(2, 1);
        put16(&mut e.bytes, 0x38, 0xffff);
        rejected_with(&e.bytes, "PN_XNUM");
    }

    #[test]
    fn elf_section_header_entry_size_other_than_64_is_rejected() {
        let mut e = elf(2, 1);
        put16(&mut e.bytes, 0x3a, 40);
        rejected_with(&e.bytes, "e_shentsize is 40");
    }

    #[test]
    fn elf_program_header_table_past_the_end_is_rejected() {
        let mut e = elf(2, 3);
        let len = e.bytes.len();
        put64(&mut e.bytes, 0x20, len as u64 - 56);
        rejected_with(
            &e.bytes,
            &format!(
                "the program header table (offset {}, 3 entries of 56 bytes) lies past the end of \
                 the {len}-byte image",
                len - 56
            ),
        );
        put64(&mut e.bytes, 0x20, u64::MAX - 8);
        rejected_with(&e.bytes, "the program header table");
    }

    #[test]
    fn elf_section_header_table_past_the_end_is_rejected() {
        let mut e = elf(4, 1);
        put64(&mut e.bytes, 0x28, 4096);
        rejected_with(
            &e.bytes,
            "the section header table (offset 4096, 4 entries of 64 bytes) lies past the end",
        );
        put64(&mut e.bytes, 0x28, u64::MAX);
        rejected_with(&e.bytes, "the section header table");
    }

    #[test]
    fn elf_extended_section_numbering_is_rejected() {
        let mut e = elf(0, 1);
        put64(&mut e.bytes, 0x28, 64);
        rejected_with(&e.bytes, "e_shnum is 0 but e_shoff is 64");
    }

    #[test]
    fn elf_without_sections_but_with_a_name_table_index_is_rejected() {
        let mut e = elf(0, 1);
        put16(&mut e.bytes, 0x3e, 1);
        rejected_with(&e.bytes, "there are no sections but e_shstrndx is 1");
    }

    #[test]
    fn elf_name_table_index_past_the_sections_is_rejected() {
        let mut e = elf(3, 1);
        put16(&mut e.bytes, 0x3e, 3);
        rejected_with(&e.bytes, "e_shstrndx is 3 but there are only 3 sections");
        put16(&mut e.bytes, 0x3e, 0xffff); // SHN_XINDEX: extended, not supported
        rejected_with(&e.bytes, "e_shstrndx is 65535");
    }

    #[test]
    fn elf_section_past_the_end_is_rejected() {
        let mut e = elf(4, 1);
        let len = e.bytes.len();
        let at = e.sh(3, 0x18);
        put64(&mut e.bytes, at, len as u64 - 8);
        rejected_with(
            &e.bytes,
            &format!(
                "the module image is a corrupt ELF: section 3 (offset {}, size 16) lies past the \
                 end of the {len}-byte image",
                len - 8
            ),
        );
    }

    #[test]
    fn elf_section_whose_end_overflows_is_rejected() {
        let mut e = elf(4, 1);
        let (off, size) = (e.sh(2, 0x18), e.sh(2, 0x20));
        put64(&mut e.bytes, off, u64::MAX - 1);
        put64(&mut e.bytes, size, 2);
        rejected_with(&e.bytes, "section 2 (offset 18446744073709551614, size 2)");
    }

    #[test]
    fn elf_nobits_section_may_lie_past_the_end() {
        let mut e = elf(4, 1);
        let (kind, size) = (e.sh(3, 4), e.sh(3, 0x20));
        put32(&mut e.bytes, kind, SHT_NOBITS);
        put64(&mut e.bytes, size, 1 << 40);
        assert!(validate(&e.bytes).is_ok());
    }

    #[test]
    fn elf_nobits_name_table_is_rejected() {
        let mut e = elf(3, 1);
        let kind = e.sh(1, 4);
        put32(&mut e.bytes, kind, SHT_NOBITS);
        rejected_with(&e.bytes, "string table (section 1) is SHT_NOBITS");
    }

    #[test]
    fn elf_name_table_without_a_final_nul_is_rejected() {
        let mut e = elf(3, 1);
        let size = e.sh(1, 0x20);
        put64(&mut e.bytes, size, 16); // ends inside ".data"
        rejected_with(&e.bytes, "string table (section 1) does not end with a NUL");
    }

    #[test]
    fn elf_section_name_outside_the_name_table_is_rejected() {
        let mut e = elf(3, 1);
        let name = e.sh(2, 0);
        put32(&mut e.bytes, name, 24);
        rejected_with(
            &e.bytes,
            "section 2's name (sh_name 24) lies outside the 24-byte section-name string table \
             (section 1)",
        );
    }

    #[test]
    fn elf_segment_past_the_end_is_rejected() {
        let mut e = elf(2, 2);
        let len = e.bytes.len();
        let filesz = e.ph(1, 0x20);
        put64(&mut e.bytes, filesz, len as u64);
        rejected_with(
            &e.bytes,
            &format!("segment 1 (offset 64, file size {len}) lies past the end of the {len}-byte"),
        );
        let offset = e.ph(1, 8);
        put64(&mut e.bytes, offset, u64::MAX);
        rejected_with(&e.bytes, "segment 1 (offset 18446744073709551615");
    }

    #[test]
    fn elf_segment_file_size_over_memory_size_is_accepted() {
        let mut e = elf(2, 1);
        let memsz = e.ph(0, 0x28);
        put64(&mut e.bytes, memsz, 0);
        assert!(validate(&e.bytes).is_ok());
    }

    // Fatbin rules, one test each.

    fn fatbin_header(header_size: u16, fat_size: u64) -> Vec<u8> {
        let mut b = FATBIN_MAGIC.to_le_bytes().to_vec();
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&header_size.to_le_bytes());
        b.extend_from_slice(&fat_size.to_le_bytes());
        b
    }

    #[test]
    fn fatbin_shorter_than_its_header_is_rejected() {
        rejected_with(
            &fatbin_header(16, 0)[..12],
            "corrupt fatbin: fatbin 0 (at offset 0): its 16-byte header lies past the end of the \
             12-byte image",
        );
    }

    #[test]
    fn fatbin_header_size_below_16_is_rejected() {
        rejected_with(
            &fatbin_header(8, 0),
            "its header_size is 8, less than the 16-byte",
        );
    }

    #[test]
    fn fatbin_size_past_the_end_is_rejected() {
        let mut img = fatbin_header(16, 1_000_000);
        img.resize(64, 0);
        rejected_with(
            &img,
            "its 16-byte header and 1000000 bytes of entries lie past the end of the 64-byte image",
        );
        rejected_with(&fatbin_header(16, u64::MAX), "lie past the end");
        rejected_with(
            &fatbin_header(0xffff, u64::MAX - 0xfffe),
            "lie past the end",
        );
    }

    #[test]
    fn fatbin_entry_header_cut_short_is_rejected() {
        let mut img = fatbin_header(16, 8);
        img.extend_from_slice(&[2, 0, 1, 1, 64, 0, 0, 0]);
        rejected_with(
            &img,
            "entry 0 (at offset 16) of fatbin 0 (at offset 0): only 8 bytes of the fatbin are left",
        );
    }

    #[test]
    fn fatbin_entry_header_size_below_64_is_rejected() {
        let mut img = fatbin(&[(1, 0, b"ptx\0")]);
        put32(&mut img, 16 + 4, 8);
        rejected_with(
            &img,
            "entry 0 (at offset 16) of fatbin 0 (at offset 0): its header_size is 8",
        );
    }

    #[test]
    fn fatbin_entry_past_the_fatbin_is_rejected() {
        let mut img = fatbin(&[(1, 0, b"ptx\0"), (1, 0, b"more ptx\0")]);
        // The second entry's payload runs past the fatbin, though not past the image.
        let second = 16 + 64 + 8;
        put64(&mut img, second + 8, 24);
        img.resize(img.len() + 64, 0);
        rejected_with(
            &img,
            &format!(
                "entry 1 (at offset {second}) of fatbin 0 (at offset 0): its 64-byte header and \
                 24-byte payload lie past the end of the fatbin, at offset {}",
                second + 64 + 16
            ),
        );
        put64(&mut img, second + 8, u64::MAX);
        rejected_with(&img, "entry 1");
        put32(&mut img, second + 4, u32::MAX);
        rejected_with(&img, "entry 1");
    }

    #[test]
    fn fatbin_uncompressed_cubin_is_checked_as_elf() {
        let e = elf(4, 2);
        let img = fatbin(&[(1, 0, b"ptx\0"), (2, FLAGS_64BIT_LINUX, &e.bytes)]);
        assert!(validate(&img).is_ok());
        let mut bad = e.bytes.clone();
        put16(&mut bad, 0x3e, 9);
        let img = fatbin(&[(1, 0, b"ptx\0"), (2, FLAGS_64BIT_LINUX, &bad)]);
        rejected_with(
            &img,
            "entry 1 (at offset 88) of fatbin 0 (at offset 0) (kind 2) is a corrupt ELF: \
             e_shstrndx is 9 but there are only 4 sections",
        );
        let mut bad = e.bytes.clone();
        let at = e.sh(3, 0x18);
        put64(&mut bad, at, 1 << 20);
        let img = fatbin(&[(2, FLAGS_64BIT_LINUX, &bad)]);
        rejected_with(&img, "lies past the end of the ");
        rejected_with(&img, "-byte payload");
    }

    #[test]
    fn fatbin_compressed_payload_is_opaque() {
        let mut bad = elf(2, 1).bytes;
        put16(&mut bad, 0x3e, 9);
        for flags in [0x2011, 0x8011] {
            assert!(validate(&fatbin(&[(2, flags, &bad)])).is_ok());
        }
    }

    #[test]
    fn fatbin_compressed_size_past_the_payload_is_rejected() {
        let mut img = fatbin(&[(2, 0x8011, &[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0])]);
        put32(&mut img, 16 + 16, 9);
        rejected_with(
            &img,
            "entry 0 (at offset 16) of fatbin 0 (at offset 0): its compressed size 9 is larger than its 8-byte payload",
        );
        put32(&mut img, 16 + 16, 8);
        assert!(validate(&img).is_ok());
    }

    #[test]
    fn fatbin_entry_header_shorter_than_the_drivers_64_bytes_is_rejected() {
        let mut img = fatbin(&[(2, 0x8011, &[0; 48])]);
        put32(&mut img, 16 + 4, 32);
        put64(&mut img, 16 + 8, 80);
        rejected_with(&img, "its header_size is 32, less than the 64 bytes");
    }

    #[test]
    fn host_side_fatbin_wrappers_are_rejected() {
        for magic in WRAPPER_MAGICS {
            let mut img = magic.to_le_bytes().to_vec();
            img.extend_from_slice(&1u32.to_le_bytes());
            img.extend_from_slice(&0xdead_beef_u64.to_le_bytes());
            img.extend_from_slice(&[0; 8]);
            rejected_with(&img, "host-side fatbin wrapper");
        }
    }

    #[test]
    fn only_text_passes_as_ptx() {
        assert!(validate(
            b".version 8.0\n.target sm_90\r\n\t// \xc3\xa9t\xc3\xa9\n\0\x01binary after the NUL"
        )
        .is_ok());
        rejected_with(b"\x01\x02\x03\x04", "control character 0x01 at offset 0");
        rejected_with(b"abc\xb1\x43", "not UTF-8 text (at offset 3)");
    }

    #[test]
    fn fatbin_ptx_and_unknown_entries_are_opaque() {
        let img = fatbin(&[(1, 0, b"\x01\x02garbage"), (0x40, 0, &[0xff; 33])]);
        assert!(validate(&img).is_ok());
    }

    #[test]
    fn concatenated_fatbins_and_zero_padding_are_accepted() {
        let mut img = fatbin(&[(1, 0, b"ptx\0")]);
        img.extend_from_slice(&[0; 8]);
        img.extend_from_slice(&fatbin(&[(2, FLAGS_64BIT_LINUX, &elf(3, 1).bytes)]));
        img.extend_from_slice(&[0; 13]);
        assert!(validate(&img).is_ok());
        let mut two = SHIPPED.to_vec();
        two.extend_from_slice(SHIPPED);
        assert!(validate(&two).is_ok());
    }

    #[test]
    fn bytes_after_a_fatbin_that_are_no_fatbin_are_rejected() {
        let mut img = fatbin(&[(1, 0, b"ptx\0")]);
        let end = img.len();
        img.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
        rejected_with(
            &img,
            &format!(
                "the bytes at offset {}, after fatbin 0, are neither zero padding nor another \
                 fatbin",
                end + 8
            ),
        );
    }

    #[test]
    fn a_corrupt_second_fatbin_is_rejected() {
        let mut img = fatbin(&[(1, 0, b"ptx\0")]);
        let second = img.len();
        img.extend_from_slice(&fatbin_header(16, 64));
        rejected_with(
            &img,
            &format!("fatbin 1 (at offset {second}): its 16-byte header and 64 bytes of entries"),
        );
    }

    #[test]
    fn every_truncation_of_the_shipped_fatbin_is_rejected() {
        for len in 4..SHIPPED.len() {
            assert!(validate(&SHIPPED[..len]).is_err(), "cut to {len} bytes");
        }
    }

    #[test]
    fn every_truncation_of_a_synthetic_cubin_is_rejected() {
        let e = elf(6, 3);
        let fat = fatbin(&[(2, FLAGS_64BIT_LINUX, &e.bytes)]);
        for img in [&e.bytes, &fat] {
            for len in 4..img.len() {
                assert!(validate(&img[..len]).is_err(), "cut to {len} bytes");
            }
        }
    }

    // Property tests.

    /// The shipped fatbin, a synthetic cubin, and a fatbin holding it uncompressed.
    fn valid_images() -> Vec<Vec<u8>> {
        let e = elf(5, 3);
        vec![
            SHIPPED.to_vec(),
            e.bytes.clone(),
            fatbin(&[(1, 0, b"ptx\0"), (2, FLAGS_64BIT_LINUX, &e.bytes)]),
        ]
    }

    /// One header field of the synthetic ELF.
    #[derive(Debug, Clone, Copy)]
    enum Field {
        ShOffset(usize),
        ShSize(usize),
        ShName(usize),
        POffset(usize),
        PFilesz(usize),
        EShoff,
        EPhoff,
        EShstrndx,
    }

    /// The corrupted ELF's shape.
    const SECTIONS: usize = 5;
    const SEGMENTS: usize = 3;

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            (0..SECTIONS).prop_map(Field::ShOffset),
            (0..SECTIONS).prop_map(Field::ShSize),
            (0..SECTIONS).prop_map(Field::ShName),
            (0..SEGMENTS).prop_map(Field::POffset),
            (0..SEGMENTS).prop_map(Field::PFilesz),
            Just(Field::EShoff),
            Just(Field::EPhoff),
            Just(Field::EShstrndx),
        ]
    }

    /// Small values (near the image's size), boundary values and anything.
    fn value() -> impl Strategy<Value = u64> {
        prop_oneof![
            0..1024u64,
            any::<u64>(),
            (0..64u64).prop_map(|d| u64::MAX - d),
            (0..64u64).prop_map(|d| u64::from(u32::MAX) - d),
            (0..64u64).prop_map(|d| u64::from(u16::MAX) - d),
        ]
    }

    fn end_exceeds(offset: u64, size: u64, len: usize) -> bool {
        offset.checked_add(size).is_none_or(|end| end > len as u64)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = prepare_image(&bytes);
        }

        #[test]
        fn elf_magic_then_arbitrary_bytes_never_panic(
            mut tail in prop::collection::vec(any::<u8>(), 0..600),
            class_data_version in any::<bool>(),
        ) {
            let mut img = ELF_MAGIC.to_vec();
            if class_data_version {
                img.extend_from_slice(&[ELFCLASS64, ELFDATA2LSB, EV_CURRENT]);
            }
            img.append(&mut tail);
            let _ = prepare_image(&img);
        }

        #[test]
        fn fatbin_magic_then_arbitrary_bytes_never_panic(
            header_size in prop_oneof![Just(16u16), any::<u16>()],
            fat_size in prop_oneof![0..700u64, any::<u64>()],
            tail in prop::collection::vec(any::<u8>(), 0..600),
        ) {
            let mut img = fatbin_header(header_size, fat_size);
            img.extend_from_slice(&tail);
            let _ = prepare_image(&img);
        }

        #[test]
        fn flipped_bytes_in_valid_images_never_panic(
            which in 0..3usize,
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            in_headers in any::<bool>(),
        ) {
            let mut img = valid_images().swap_remove(which);
            // Either within the first 256 bytes, where the headers are, or anywhere.
            let span = if in_headers { img.len().min(256) } else { img.len() };
            for (at, v) in flips {
                img[at.index(span)] = v;
            }
            let _ = prepare_image(&img);
        }

        #[test]
        fn truncated_valid_images_are_rejected(which in 0..3usize, cut in any::<prop::sample::Index>()) {
            let img = valid_images().swap_remove(which);
            let len = cut.index(img.len());
            let r = validate(&img[..len]);
            // Under 4 bytes the magic is gone: checked as PTX, which passes only as text (a
            // fatbin's first byte, `P`, is; an ELF's 0x7f is not).
            if len >= 4 {
                prop_assert!(r.is_err(), "cut to {} bytes: {:?}", len, r);
            } else {
                prop_assert!(r.is_ok() == (len > 0 && check_ptx(&img[..len]).is_ok()));
            }
        }

        #[test]
        fn corrupted_elf_fields_never_panic_and_overruns_are_rejected(f in field(), v in value()) {
            let mut e = elf(SECTIONS, SEGMENTS);
            let len = e.bytes.len();
            let b = &mut e.bytes;
            let (sh, ph) = (e.shoff, e.phoff);
            let must_reject = match f {
                Field::ShOffset(i) | Field::ShSize(i) => {
                    let (o, s) = (sh + i * 64 + 0x18, sh + i * 64 + 0x20);
                    put64(b, if matches!(f, Field::ShOffset(_)) { o } else { s }, v);
                    end_exceeds(read_u64(b, o).unwrap(), read_u64(b, s).unwrap(), len)
                }
                Field::POffset(i) | Field::PFilesz(i) => {
                    let (o, s) = (ph + i * 56 + 8, ph + i * 56 + 0x20);
                    put64(b, if matches!(f, Field::POffset(_)) { o } else { s }, v);
                    end_exceeds(read_u64(b, o).unwrap(), read_u64(b, s).unwrap(), len)
                }
                Field::ShName(i) => {
                    put32(b, sh + i * 64, v as u32);
                    v as u32 >= STRTAB.len() as u32
                }
                Field::EShoff => {
                    put64(b, 0x28, v);
                    end_exceeds(v, SECTIONS as u64 * 64, len)
                }
                Field::EPhoff => {
                    put64(b, 0x20, v);
                    end_exceeds(v, SEGMENTS as u64 * 56, len)
                }
                Field::EShstrndx => {
                    put16(b, 0x3e, v as u16);
                    usize::from(v as u16) >= SECTIONS
                }
            };
            let r = validate(&e.bytes);
            if must_reject {
                prop_assert!(
                    matches!(r, Err(Error::InvalidArgument(_))),
                    "{:?} = {} was accepted", f, v
                );
            }
            // The same corruption inside a fatbin entry is caught as well.
            let fat = fatbin(&[(2, FLAGS_64BIT_LINUX, &e.bytes)]);
            if must_reject {
                prop_assert!(validate(&fat).is_err(), "{:?} = {} was accepted in a fatbin", f, v);
            }
        }
    }
}
