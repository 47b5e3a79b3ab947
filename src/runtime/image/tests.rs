//! Unit tests of the image checks: hand-built cubins and fatbins, the shipped fatbin, and
//! property tests feeding arbitrary and corrupted bytes.

use super::*;
use proptest::prelude::*;

const SHIPPED: &[u8] = include_bytes!("../../../tests/kernels/kernels.fatbin");

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
        Err(Error::InvalidArgument(m)) if m.kind() == Refusal::Image => m.message().to_string(),
        other => panic!("expected an image refusal, got {other:?}"),
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
                matches!(&r, Err(e) if e.refusal() == Some(Refusal::Image)),
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
