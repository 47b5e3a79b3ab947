//! Module images checked before `cuModuleLoadData` sees them.
//!
//! The driver takes no length: it trusts the image's own headers. So every range a cubin (ELF64)
//! or fatbin declares is checked against the bytes the caller gave; anything else must be PTX
//! text, which the driver reads up to a NUL.

use crate::error::{Error, Refusal, Result};

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
        return Err(Error::invalid(Refusal::Image, "the module image is empty"));
    }
    if image.starts_with(&ELF_MAGIC) {
        check_elf(image, "image").map_err(|m| {
            Error::invalid(
                Refusal::Image,
                format!("the module image is a corrupt ELF: {m}"),
            )
        })
    } else if read_u32(image, 0) == Some(FATBIN_MAGIC) {
        check_fatbins(image).map_err(|m| {
            Error::invalid(
                Refusal::Image,
                format!("the module image is a corrupt fatbin: {m}"),
            )
        })
    } else if let Some(magic) = read_u32(image, 0).filter(|m| WRAPPER_MAGICS.contains(m)) {
        Err(Error::invalid(Refusal::Image, format!(
            "the module image is a host-side fatbin wrapper (magic {magic:#010x}), which points at              memory elsewhere: pass the fatbin itself (magic 0xBA55ED50)"
        )))
    } else {
        check_ptx(image).map_err(|m| {
            Error::invalid(
                Refusal::Image,
                format!("the module image is neither an ELF cubin, a fatbin nor PTX text: {m}"),
            )
        })
    }
}

/// [`check_ptx`] as the crate's error, for PTX text handed in as such (`Device::load_ptx`).
pub(crate) fn check_ptx_text(text: &[u8]) -> Result<()> {
    check_ptx(text)
        .map_err(|m| Error::invalid(Refusal::Image, format!("the PTX text is not text: {m}")))
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
mod tests;
