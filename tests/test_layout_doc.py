"""docs/layout.md stays true to kvbits/decode/layout.py: its worked example's words, registers and
tile positions are recomputed with the library, and its glossary names only what the code uses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from kvbits.decode import layout
from kvbits.packing import pack_bits

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "layout.md"
CODE_FILES = [ROOT / "kvbits" / "decode" / name for name in ("kernel.py", "launch.py", "layout.py")]


def _doc() -> str:
    return DOC.read_text()


def _block(kind: str) -> dict[str, str]:
    """The ``key: value`` lines of the doc's fenced block ```<kind>."""
    match = re.search(rf"```{kind}\n(.*?)```", _doc(), re.S)
    assert match, f"docs/layout.md has no ```{kind} block"
    return dict(line.split(":", 1) for line in match.group(1).strip().splitlines())


def _example() -> tuple[int, int, list[int], list[int]]:
    block = _block("layout-example")
    codes = [int(c) for c in block["codes"].split()]
    planes = [int(w, 16) for w in block["planes"].split()]
    return int(block["bits"]), int(block["classes"]), codes, planes


def _planes_from_table(codes: list[int], bits: int, classes: int) -> list[int]:
    table = layout.decode_bit_table(bits, classes)
    return [sum(((codes[v] >> b) & 1) << j for j, (v, b) in enumerate(table[p * 32:(p + 1) * 32]))
            for p in range(bits)]


def _registers(planes: list[int], classes: int) -> list[tuple[int, int]]:
    """The 16 (register, class) of a 3-bit group in register order, joined as unpack_group joins them."""
    evens, odds = layout.three_bit_classes(*[torch.tensor([w]) for w in planes], classes)
    words = layout._join(layout._join8([r for r, _ in evens]), layout._join8([r for r, _ in odds]))
    cls = layout._join(layout._join8([torch.tensor([c]) for _, c in evens]),
                       layout._join8([torch.tensor([c]) for _, c in odds]))
    return list(zip(words.flatten().tolist(), cls.flatten().tolist(), strict=True))


def _eval_mask_expression(text: str, names: dict[str, int]) -> int:
    """Evaluate an expression of names, int literals, >>, & and | (nothing else is allowed)."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp):
            ops = {ast.RShift: lambda a, b: a >> b, ast.BitAnd: lambda a, b: a & b, ast.BitOr: lambda a, b: a | b}
            return ops[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"unexpected syntax in {text!r}")
    return walk(ast.parse(text, mode="eval"))


def _register_rows() -> list[list[str]]:
    rows = []
    example = _doc().split("## 9. Worked example", 1)[-1].split("## 10.", 1)[0]
    for line in example.splitlines():
        if re.match(r"\|\s*\d+\s*\|", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            rows.append([c.replace("\\|", "|").strip("`") for c in cells])
    return rows


def test_example_planes_are_the_bit_table_of_its_codes():
    bits, classes, codes, planes = _example()
    assert len(codes) == 32 and all(0 <= c < 2**bits for c in codes)
    assert classes == layout.code_classes(16)  # the tile of the second block
    assert planes == _planes_from_table(codes, bits, classes)
    back = layout.unpack_group([torch.tensor([w]) for w in planes], bits, classes)
    assert back.flatten().tolist() == codes


def test_example_canonical_words():
    bits, _, codes, _ = _example()
    words = pack_bits(torch.tensor([codes], dtype=torch.uint8), bits, layout="word", backend="torch")[0]
    canonical = [int(w, 16) for w in _block("layout-example")["canonical"].split()]
    assert [int(w) & 0xFFFFFFFF for w in words] == canonical


def test_example_registers():
    bits, classes, codes, planes = _example()
    assert bits == 3
    rows = _register_rows()
    assert len(rows) >= 4, "the register table of the worked example is missing"
    registers = _registers(planes, classes)
    for r_text, expression, word_text, cls_text, fp16_text, codes_text in rows:
        r, word, cls = int(r_text), int(word_text, 16), int(cls_text)
        assert _eval_mask_expression(expression, {"w0": planes[0], "w1": planes[1], "w2": planes[2]}) == word
        assert registers[r] == (word, cls)
        halves = torch.tensor([word], dtype=torch.int64).to(torch.int32).view(torch.float16).float() * 2**24
        assert halves.tolist() == [float(x) for x in fp16_text.split(",")]
        pair = [int(x) for x in codes_text.split(",")]
        assert pair == codes[2 * r:2 * r + 2]
        assert [(word & 0xFFFF) >> 3 * cls, (word >> 16) >> 3 * cls] == pair


def test_example_tile_words():
    bits, _, codes, planes = _example()
    block = _block("layout-tile")
    role, d, tile, warps, thread = (block["role"].strip(), int(block["d"]), int(block["tile"]),
                                    int(block["warps"]), int(block["thread"]))
    n, k = layout.tile_shape(role, d, tile)
    assert (n, k) == (16, 64) and layout.groups_per_thread(n, k, warps) == 1
    th, tl = divmod(thread, 4)
    codes_tile = torch.zeros(n, k, dtype=torch.uint8)
    for v, c in enumerate(codes):  # the doc's placement formula for thread `thread`
        codes_tile[th + 8 * (v // 16), 16 * ((v // 4) % 4) + 4 * tl + v % 4] = c
    words = layout.pack_tile(codes_tile, bits, role, d, tile, warps)
    expected = {int(i): int(w, 16) for i, w in (item.split("=") for item in block["words"].split())}
    got = {i: int(w) & 0xFFFFFFFF for i, w in enumerate(words.tolist()) if w}
    assert got == expected
    assert [expected[p * 32 + thread] for p in range(bits)] == planes
    held = layout.held_tile(words, bits, role, d, tile, warps)
    assert torch.equal(held, codes_tile.to(torch.int64))


@pytest.mark.parametrize("role", ["k", "v"])
def test_word_index_formula(role):
    """Section 7's index of plane p, group g of thread T, for a layout with two runs per thread."""
    bits, d, tile, warps = 3, 128, 64, 1
    n, k = layout.tile_shape(role, d, tile)
    nrg = layout.groups_per_thread(n, k, warps)
    r, threads = layout.run_length(nrg), 32 * warps
    src, _ = layout._pack_plan(bits, role, d, tile, warps, torch.device("cpu"))  # [W, 32] tile elements
    held_index = layout._tile_elements(role, n, k).flatten()  # held position -> tile element
    owner = layout._place(torch.arange(threads * nrg * 32).reshape(threads, nrg * 32), n, k, warps).flatten()
    element_owner = torch.empty_like(owner)
    element_owner[held_index] = owner  # tile element -> flat (thread, group, value) index
    for p in range(bits):
        for t in (0, 5, 31):
            for g in range(nrg):
                index = ((p * (nrg // r) + g // r) * threads + t) * r + g % r
                flat = element_owner[src[index]]
                assert (flat // (nrg * 32) == t).all() and ((flat // 32) % nrg == g).all()


def _glossary_terms() -> list[str]:
    section = _doc().split("## 10. Glossary", 1)
    assert len(section) == 2, "docs/layout.md has no glossary"
    terms = []
    for line in section[1].splitlines():
        if line.startswith("- "):
            terms += re.findall(r"`([A-Za-z_][A-Za-z_0-9]*)`:", line)
    return terms


def test_glossary_terms_are_used_by_the_code():
    terms = _glossary_terms()
    code = "\n".join(path.read_text() for path in CODE_FILES)
    required = {"classes", "held", "planes", "runs", "pairs", "tile", "BLOCK_T", "NRG", "COLS", "VCOLS", "QROWS",
                "HALF", "GROUP", "SCALE_WORDS", "CLASSES", "SINKS", "RING", "WINDOW"}
    assert required <= set(terms)
    missing = [t for t in terms if not re.search(rf"\b{re.escape(t)}\b", code)]
    assert not missing, f"glossary terms not in kernel.py, launch.py or layout.py: {missing}"


def test_masks_named_in_the_doc_are_the_codes():
    doc = _doc()
    for mask in ("0x00030003", "0x000F000F", *(f"0x{m:08X}" for m in layout.THREE_BIT_FIELDS)):
        assert mask in doc
    kernel = (ROOT / "kvbits" / "decode" / "kernel.py").read_text()
    for mask in ("0x00030003", "0x000F000F", "0x00070007", "0x00380038", "0x01C001C0"):
        assert mask in kernel
