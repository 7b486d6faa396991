"""``scripts/sass_path.py``'s walk of a SASS listing (pure text: no compiler needed)."""

from _helpers import load_script

LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   ISETP.GT.AND P0, PT, R0, 0x7, PT ;
        /*0020*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0030*/              @!P0 BRA `(.L_x_0) ;
        /*0040*/                   LDG.E.U16 R4, desc[UR4][R2.64] ;
        /*0050*/                   LDG.E.U16 R5, desc[UR4][R2.64+0x2] ;
.L_x_0:
        /*0060*/                   FMNMX R6, R4, R5, !PT ;
        /*0070*/              @!P1 BRA `(.L_x_1) ;
        /*0080*/                   SHFL.BFLY PT, R7, R6, 0x1, 0x1f ;
.L_x_1:
        /*0090*/                   BRA `(.L_x_2) ;
        /*00a0*/                   FADD R6, R6, R7 ;
.L_x_2:
        /*00b0*/                   NOP ;
        /*00c0*/                   STG.E.128 desc[UR4][R2.64], R4 ;
        /*00d0*/                   EXIT ;
        /*00e0*/                   BRA `(.L_x_3) ;
.L_x_3:
"""


def test_the_path_takes_the_whole_vectors_and_falls_through_the_rest():
    """The vector load, and the branch over the scalar ragged end taken; a predicated
    branch over no scalar access falls through (the shuffle is on the path); an
    unconditional branch is followed (the add is not); NOPs are not counted; the walk
    ends at the unpredicated EXIT."""
    sp = load_script("scripts/sass_path.py")
    ops = sp.path(LISTING)
    assert ops == ["S2R", "ISETP", "LDG", "BRA", "FMNMX", "BRA", "SHFL", "BRA", "STG", "EXIT"]
    assert sp.classes(ops) == {"float": 1, "memory": 2, "exchange": 1, "integer/control": 6}
