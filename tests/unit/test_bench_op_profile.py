"""bench/op_profile.py names each traced op by the JAX operation it came from."""

import sys

from paths import REPO

sys.path.insert(0, str(REPO))  # the repository's bench/

from bench import op_profile  # noqa: E402

# Three lines as XLA:CPU prints a compiled module (shortened): a fusion in the
# backward's loop body, a dot at the top level, a constant without metadata.
BWD = ("jit(<lambda>)/transpose(jvp(Transformer))/Transformer._depth_linear_stack/"
       "while/body/closed_call/scatter")
FWD = "jit(<lambda>)/jvp(Transformer)/while/body/closed_call/checkpoint/blocks/attn/dot_general"
HLO = "\n".join([
    "  %transpose_copy_fusion.7 = f32[8,64,65,64]{3,2,1,0} fusion(%wrapped_scatter), "
    f'kind=kLoop, calls=%fc.558, metadata={{op_name="{BWD}" stack_frame_id=616}}',
    f'  ROOT %dot.40 = f32[512,64]{{1,0}} dot(%a, %b), metadata={{op_name="{FWD}"}}',
    "  %constant.3 = f32[] constant(0)",
])


def test_op_names_reads_each_instruction_op_name_and_shape():
    names = op_profile.op_names(HLO)
    assert names == {"transpose_copy_fusion.7": (BWD, "f32[8,64,65,64]{3,2,1,0}"),
                     "dot.40": (FWD, "f32[512,64]{1,0}")}


def test_source_group_keeps_the_pass_and_the_operation_path():
    names = op_profile.op_names(HLO)
    assert (op_profile.source_group(names["transpose_copy_fusion.7"][0])
            == "bwd: Transformer._depth_linear_stack/scatter")
    assert op_profile.source_group(names["dot.40"][0]) == "fwd: blocks/attn/dot_general"
    assert op_profile.source_group(names["dot.40"][0], depth=1) == "fwd: blocks"
    assert op_profile.source_group("jit(f)/jvp(g)") == "fwd: (top level)"


def test_op_kind_drops_the_instance_number():
    assert op_profile.op_kind("transpose_copy_fusion.7") == "transpose_copy_fusion"
    assert op_profile.op_kind("ynn_fusion") == "ynn_fusion"
    assert op_profile.op_kind("while.504") == "while"
