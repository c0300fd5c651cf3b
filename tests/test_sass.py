"""The static instruction budget's readers, on listings written here (no compiler needed)."""

from __future__ import annotations

from harness.measure import sass

LISTING = """
        .text._k:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0030*/                   LOP3.LUT R3, R2, 0x70007, R5, 0xf8, !PT ;
        /*0040*/                   HADD2 R3, R3, -1028, -1028 ;
        /*0050*/                   IMAD.MOV.U32 R6, RZ, RZ, R3 ;
        /*0060*/                   HMMA.16816.F32 R8, R4, R6, R8 ;
        /*0070*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0080*/               @P0 BRA `(.L_x_0) ;
        /*0090*/               @!P0 BRA `(.L_x_1) ;
        /*00a0*/                   STG.E desc[UR4][R4.64], R8 ;
.L_x_1:
        /*00b0*/                   EXIT ;
.L_x_2:
        /*00c0*/                   BRA `(.L_x_2);
"""

USAGE = """
Resource usage:
 Common:
  GLOBAL:11 CONSTANT[4]:8
 Function _decode_split_kernel:
  REG:226 STACK:8 SHARED:1024 LOCAL:0 CONSTANT[0]:792 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_loops_are_backward_branches_and_forward_ones_are_not():
    count, loops = sass.parse_sass(LISTING)
    assert count == 13
    (loop,) = loops  # the forward branch and the one-instruction trap loop are no loops
    assert loop.label == ".L_x_0"
    assert loop.opcodes == ["LDG.E", "LOP3.LUT", "HADD2", "IMAD.MOV.U32", "HMMA.16816.F32", "ISETP.NE.AND", "BRA"]
    assert loop.mix == {"memory": 1, "bits": 1, "fp": 1, "moves": 1, "mma": 1, "int/control": 2}


def test_resource_usage_and_metrics():
    assert sass.parse_usage(USAGE) == {"_decode_split_kernel": (226, 8, 1024)}
    count, loops = sass.parse_sass(LISTING)
    budget = sass.Budget("k", 90, 226, 8, 1024, count, loops)
    figures = budget.metrics(elements_per_iteration_per_thread=3.5)
    assert figures["loop_instructions"] == 7 and figures["instructions_per_element"] == 2.0
    assert abs(sum(figures["loop_mix"].values()) - 1.0) < 0.01 and figures["stack_bytes"] == 8
    assert "hottest loop 7" in sass.format_budget(budget)


def test_instruction_classes():
    assert sass.instruction_class("IMAD.MOV.U32") == "moves"
    assert sass.instruction_class("IMAD.WIDE.U32") == "int/control"
    assert sass.instruction_class("LDGSTS.E.BYPASS.128") == "memory"
    assert sass.instruction_class("HMMA.16816.F32") == "mma"
    assert sass.instruction_class("SHF.R.U32.HI") == "bits"


def test_decode_specializations_count_their_elements():
    from kvbits.aot import AotSpec

    spec = AotSpec("d", None, {}, {"BLOCK_T": 64, "D": 128, "WARPS": 2}, 2)
    assert sass.elements_per_thread(spec) == 256
    assert sass.elements_per_thread(AotSpec("p", None, {}, {"BITS": 3}, 4)) is None
