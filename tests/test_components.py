"""The model as components: position, attention, MLP and norm kinds chosen by config fields, each one class.

Each component is held to the peer that defines it (timm's layers, on the same weights and input, float32: 1e-5 of
the output scale); kind names are compared nowhere outside their class (an AST walk); and a new position kind is
one class: added to a copy of the modeling files, it trains, saves, loads as remote code and exports to ONNX.
"""

import ast
import json
import shutil
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from hubvit import HubViTForImageClassification
from hubvit.folder import MODELING_FILES
from hubvit.modeling.heads_hubvit import POOLING_KINDS
from hubvit.modeling.layers_hubvit import MLP_KINDS, NORM_KINDS, NORM_PLACEMENTS, HubViTAttention, RMSNorm
from hubvit.modeling.positions_hubvit import POSITION_KINDS, LearnedTable, NoPosition, PositionKind
from hubvit.modeling.rotary_hubvit import ROTARY_KINDS, Positions
from utils import TINY, assert_close, randomize_, run_without_hubvit, tiny_config

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ["modeling", "conversion", "analysis", "hubvit", "cli", "training", "scripts", "benchmarks"]
KIND_NAMES = {"learned", "learned_2d", "relative_2d", "relative_2d_class", "relative_2d_mlp", "sincos_2d", "none"}
KIND_FIELDS = {
    # field: (its registry, words that mark an expression as reading the field, the file that defines the kinds)
    "position_embedding_type": (POSITION_KINDS, ("position", "posemb", "kind"), "positions_hubvit.py"),
    "rope_type": (ROTARY_KINDS, ("rope", "rotary"), "rotary_hubvit.py"),
    "mlp_type": (MLP_KINDS, (), "layers_hubvit.py"),
    "norm_type": (NORM_KINDS, (), "layers_hubvit.py"),
    "norm_placement": (NORM_PLACEMENTS, ("placement",), "layers_hubvit.py"),
    "pooling": (POOLING_KINDS, (), "heads_hubvit.py"),
}


# --- no kind compared by name ---------------------------------------------------------------------------------------


def strings(node):
    """The string constants of `node`, alone or in a literal tuple, list or set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def kind_name_uses(source, filename="<source>"):
    """(line, text) of every place a kind's name stands for the kind outside the file that defines it: a comparison
    (`==`, `!=`, `in`, `not in`) with a kind's name, and a dict literal keyed by kinds' names. A name with an
    underscore counts anywhere; a plain word ("none", "mean", "map", "pre") only where the other side of the
    comparison reads the field (its text names the field or one of its marks), and as dict keys only when every key
    is a name of that one registry (two or more)."""
    found, home = [], filename.rsplit("/", 1)[-1]
    fields = [
        (registry, (field, *marks)) for field, (registry, marks, defines) in KIND_FIELDS.items() if home != defines
    ]
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare) and all(
            isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops
        ):
            operands = [node.left, *node.comparators]
            constants = set().union(*map(strings, operands))
            others = " ".join(ast.get_source_segment(source, o) or "" for o in operands if not strings(o))
            for registry, marks in fields:
                names = constants & set(registry)
                if any("_" in name for name in names) or (names and any(mark in others for mark in marks)):
                    found.append((node.lineno, ast.get_source_segment(source, node)))
                    break
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            for registry, _ in fields:
                named = keys & set(registry)
                if named and keys <= set(registry) and (len(named) >= 2 or any("_" in name for name in named)):
                    found.append((node.lineno, ast.get_source_segment(source, node)))
                    break
    return found


def test_the_kind_name_check_finds_the_uses_it_forbids():
    source = textwrap.dedent(
        """
        if config.position_embedding_type == "learned": pass
        if kind in ("sincos_2d", "none"): pass
        if config.position_embedding_type != "none": pass
        if config.pooling == "none": pass
        if args.report_to != "none": pass
        if config.mlp_type == "gated": pass
        if config.norm_placement == "residual_post": pass
        if pool_type == "map": pass
        FAMILY = {"relative_2d_class": 1, "relative_2d_mlp": 2}
        POOLS = {"cls": "token", "mean": "avg"}
        READ = {"token": "cls", "avg": "mean"}
        if block.get("mlp_type") != "mlp": pass
        """
    )
    assert [line for line, _ in kind_name_uses(source)] == [2, 3, 4, 5, 7, 8, 10, 11, 13]


def test_no_kind_is_named_outside_its_class():
    """Each registry's file is where its names live; every other file asks the kind (`config.position_kind`,
    `config.pooling_kind`, `config.mlp_kind`, ...) or a table keyed by kind classes (conversion/kinds.py)."""
    found = []
    for folder in LIBRARY:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [(str(path.relative_to(ROOT)), *hit) for hit in kind_name_uses(path.read_text(), str(path))]
    assert found == []


def test_every_registry_is_filled_by_its_classes():
    assert set(POSITION_KINDS) == KIND_NAMES
    assert set(MLP_KINDS) == {"mlp", "gated"} and set(NORM_KINDS) == {"layer_norm", "rms_norm"}
    assert set(NORM_PLACEMENTS) == {"pre", "residual_post"}
    assert set(POOLING_KINDS) == {"cls", "mean", "map", "first", "cls_mean", "none"}
    assert set(ROTARY_KINDS) == {"axial", "dinov3", "mixed"}
    assert tiny_config().position_kind is LearnedTable
    with pytest.raises(ValueError, match=r"mlp_type='swish' is not supported; expected one of \['mlp', 'gated'\]"):
        tiny_config(mlp_type="swish")
    with pytest.raises(ValueError, match=r"position_embedding_type='rope' is not supported; expected one of"):
        tiny_config(position_embedding_type="rope")


# --- each component against its peer (timm) -------------------------------------------------------------------------


def test_gated_mlp_equals_timms_packed_swiglu():
    from timm.layers import GluMlp

    config = tiny_config(mlp_type="gated", hidden_act="silu")
    ours = MLP_KINDS["gated"](config)
    theirs = GluMlp(32, 2 * 64, act_layer=nn.SiLU, gate_last=False)
    randomize_(theirs, seed=1)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x), theirs(x), "gated MLP")


def test_gated_mlp_equals_timms_split_swiglu_with_its_projections_packed():
    from timm.layers import SwiGLU

    config = tiny_config(mlp_type="gated", hidden_act="silu")
    theirs = randomize_(SwiGLU(32, 64), seed=2)
    ours = MLP_KINDS["gated"](config)
    weights = theirs.state_dict()
    ours.load_state_dict(
        {
            "fc1.weight": torch.cat([weights["fc1_g.weight"], weights["fc1_x.weight"]]),
            "fc1.bias": torch.cat([weights["fc1_g.bias"], weights["fc1_x.bias"]]),
            "fc2.weight": weights["fc2.weight"],
            "fc2.bias": weights["fc2.bias"],
        }
    )
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x), theirs(x), "gated MLP")


def test_rms_norm_equals_timms():
    from timm.layers import RmsNorm

    theirs = randomize_(RmsNorm(32, eps=1e-6), seed=3)
    ours = RMSNorm(32, eps=1e-6)
    ours.load_state_dict(theirs.state_dict())
    x = 3 * torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x), theirs(x), "RMSNorm")


def attention_of(config):
    """One attention layer of `config`, eager (the peers' own written-out attention)."""
    config._attn_implementation = "eager"
    return HubViTAttention(config, config.position_kind(config)).eval()


def test_fused_attention_with_qk_norm_and_no_projection_bias_equals_timms():
    from timm.layers import Attention

    config = tiny_config(qk_norm=True, proj_bias=False, layer_norm_eps=1e-6)
    theirs = Attention(32, 4, qkv_bias=True, qk_norm=True, proj_bias=False, norm_layer=partial(nn.LayerNorm, eps=1e-6))
    randomize_(theirs.eval(), seed=4)
    ours = attention_of(config)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x, (4, 4))[0], theirs(x), "attention")


@pytest.mark.parametrize("fused", [True, False])
def test_attention_with_query_and_value_biases_only_equals_evas(fused):
    """EVA, BEiT and DINOv3 `_qkvb` have no key bias: fused (`qkv` + `q_bias` / `v_bias`) or separate projections."""
    from timm.models.eva import EvaAttention

    config = tiny_config(key_bias=False, qkv_fused=fused)
    theirs = randomize_(EvaAttention(32, 4, qkv_bias=True, qkv_fused=fused, scale_norm=False).eval(), seed=5)
    weights = {k: v for k, v in theirs.state_dict().items() if k != "k_bias"}
    renames = {"q_proj.": "q.", "k_proj.": "k.", "v_proj.": "v."}
    for old, new in renames.items():
        weights = {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in weights.items()}
    ours = attention_of(config)
    ours.load_state_dict(weights)
    assert ours.k.bias is None if not fused else ours.qkv.bias is None
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x, (4, 4))[0], theirs(x), "attention")


def test_separate_projections_compute_what_the_fused_one_does_on_the_same_weights():
    fused = randomize_(attention_of(tiny_config()), seed=6)
    separate = attention_of(tiny_config(qkv_fused=False))
    q, k, v = fused.qkv.weight.chunk(3)
    qb, kb, vb = fused.qkv.bias.chunk(3)
    separate.load_state_dict(
        {
            "q.weight": q,
            "q.bias": qb,
            "k.weight": k,
            "k.bias": kb,
            "v.weight": v,
            "v.bias": vb,
            **{f"proj.{name}": value for name, value in fused.proj.state_dict().items()},
        }
    )
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert_close(separate(x, (4, 4))[0], fused(x, (4, 4))[0], "attention")


def test_grouped_key_value_heads_equal_timms_attention():
    """Sapiens2's grouped-query attention: two key/value heads for four query heads, each shared by two neighbours,
    with a norm over each head's queries and keys."""
    from timm.layers import AttentionRope

    config = tiny_config(qkv_fused=False, num_key_value_heads=2, qk_norm=True, layer_norm_eps=1e-6)
    theirs = AttentionRope(32, 4, num_kv_heads=2, qkv_fused=False, qk_norm=True, norm_layer=nn.LayerNorm)
    randomize_(theirs.eval(), seed=8)
    renames = {"q_proj.": "q.", "k_proj.": "k.", "v_proj.": "v."}
    weights = {}
    for name, value in theirs.state_dict().items():
        prefix = next((old for old in renames if name.startswith(old)), None)
        weights[renames[prefix] + name[len(prefix) :] if prefix else name] = value
    ours = attention_of(config)
    ours.load_state_dict(weights)
    assert ours.k.weight.shape == (16, 32)
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert_close(ours(x, (4, 4))[0], theirs(x), "attention")


def test_grouped_key_value_heads_compute_full_attention_with_each_shared_head_copied():
    """One key/value head for four query heads is multi-head attention whose four key/value heads are copies."""
    grouped = randomize_(attention_of(tiny_config(qkv_fused=False, num_key_value_heads=1)), seed=9)
    full = attention_of(tiny_config(qkv_fused=False))
    weights = grouped.state_dict()
    for name in ("k.weight", "k.bias", "v.weight", "v.bias"):
        weights[name] = weights[name].repeat(4, *([1] * (weights[name].dim() - 1)))
    full.load_state_dict(weights)
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    assert_close(grouped(x, (4, 4))[0], full(x, (4, 4))[0], "attention")


@pytest.mark.parametrize(
    "fields",
    [
        dict(mlp_type="gated", hidden_act="silu", norm_type="rms_norm", qk_norm=True),
        dict(key_bias=False, qkv_fused=False, proj_bias=False, mlp_bias=False, pooling="map", class_token=False),
        dict(qkv_fused=False, num_key_value_heads=[1, 4]),
    ],
    ids=["gated-rms-qk-norm", "separate-no-key-bias-map", "grouped-key-value-heads-per-block"],
)
def test_a_model_of_new_components_saves_and_loads_as_remote_code_with_the_same_outputs(tmp_path, fields):
    model = randomize_(HubViTForImageClassification(tiny_config(num_labels=3, **fields)), seed=7).eval()
    model.save_pretrained(tmp_path / "folder")
    x = torch.randn(2, 3, 40, 24, generator=torch.Generator().manual_seed(0))
    torch.save(x, tmp_path / "x.pt")
    with torch.no_grad():
        expected = model(x).logits
    seen = run_without_hubvit(
        f"""
        import json, torch
        from transformers import AutoModelForImageClassification
        model, info = AutoModelForImageClassification.from_pretrained(
            {str(tmp_path / "folder")!r}, trust_remote_code=True, output_loading_info=True)
        with torch.no_grad():
            logits = model.eval()(torch.load({str(tmp_path / "x.pt")!r}, weights_only=True)).logits
        print(json.dumps(dict(logits=logits.tolist(), info={{k: sorted(map(str, v)) for k, v in info.items()}})))
        """,
        tmp_path,
    )
    assert not any(seen["info"].get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert_close(torch.tensor(seen["logits"]), expected, "logits loaded as remote code")


class SwapHalves(PositionKind):
    """A rotation for the test (no `name`, so not registered): the patch tokens' queries and keys get their two
    halves of channels swapped, a fixed orthogonal map; prefix tokens keep theirs."""

    rotates = True

    def rotate(self, attention, query, key, grid):
        patches = grid[0] * grid[1]

        def swap(x):
            rotated = torch.cat(x[..., -patches:, :].chunk(2, dim=-1)[::-1], dim=-1)
            return torch.cat([x[..., :-patches, :], rotated], dim=-2)

        return swap(query), swap(key)


def test_a_rotating_kind_turns_the_patch_queries_and_keys_before_the_product_and_leaves_the_prefix():
    config = tiny_config()
    config._attn_implementation = "eager"
    attention = randomize_(HubViTAttention(config, SwapHalves(config)).eval(), seed=8)
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output, weights = attention(x, (4, 4), output_attentions=True)
        query, key, value = attention.project(x)
        query, key = (torch.cat([t[:, :, :1], torch.cat(t[:, :, 1:].chunk(2, -1)[::-1], -1)], 2) for t in (query, key))
        expected = torch.softmax(query @ key.transpose(-1, -2) * 8**-0.5, -1)
        plain = HubViTAttention(config, NoPosition(config)).eval()
        plain.load_state_dict(attention.state_dict())
        _, unrotated = plain(x, (4, 4), output_attentions=True)
    assert_close(weights, expected, "attention weights")
    assert not torch.allclose(weights, unrotated), "the rotation changed nothing"


def test_no_attention_hook_is_called_where_no_part_defines_it():
    """A learned table alone adds nothing inside the blocks, so `Positions` hands them no hook to call."""
    positions = Positions(tiny_config())
    assert (positions.query_bias, positions.rotate, positions.logits_bias) == (None, None, None)


def test_every_part_that_defines_an_attention_hook_is_called(monkeypatch):
    """A rotary part that also biases the logits has its bias added to the position kind's, not silently dropped
    (as a hook reached only through the position kind would be)."""

    class BiasingRotary(ROTARY_KINDS["axial"]):
        rope_type = None  # kept out of the registry

        def logits_bias(self, attention, grid, num_tokens):
            return torch.full((1, attention.num_heads, num_tokens, num_tokens), 0.5)

    config = tiny_config(position_embedding_type="relative_2d", rope_type="axial")
    monkeypatch.setattr(type(config), "rotary_kind", property(lambda self: BiasingRotary))
    positions = Positions(config)
    attention = randomize_(HubViTAttention(config, positions), seed=3)
    alone = positions.kind.logits_bias(attention, (4, 4), 17)
    assert_close(positions.logits_bias(attention, (4, 4), 17), alone + 0.5, "summed logits bias")
    assert positions.rotate == positions.rotary.rotate


# --- a new position kind is one class -------------------------------------------------------------------------------

TOY_KIND = '''

class LearnedRows(PositionKind):
    """A toy kind for the test: one learned vector per patch row, added to every patch of that row."""

    name = "learned_rows"
    description = "learned vector per patch row"
    positional = adds_table = learned = True

    def build(self, embeddings):
        embeddings.position_rows = nn.Parameter(torch.zeros(embeddings.grid_size[0], self.config.hidden_size))

    def init_weights(self, embeddings, init):
        init.normal_(embeddings.position_rows, std=self.config.initializer_range)

    def patch_table(self, embeddings, grid):
        native = (embeddings.grid_size[0], 1)
        rows = resize_as_configured(self.config, embeddings.position_rows[None], native, (grid[0], 1))[0]
        return rows[:, None, :].expand(-1, grid[1], -1).reshape(1, grid[0] * grid[1], -1)

    def resize(self, embeddings, new_grid):
        rows = self.patch_table(embeddings, new_grid).reshape(new_grid[0], new_grid[1], -1)[:, 0]
        embeddings.position_rows = nn.Parameter(rows.detach().clone())
'''


@pytest.mark.heavy
def test_a_new_position_kind_is_one_class_that_trains_saves_loads_and_exports(tmp_path):
    package = tmp_path / "toykind"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in MODELING_FILES:
        shutil.copy(ROOT / "modeling" / name, package / name)
    with open(package / "positions_hubvit.py", "a") as handle:
        handle.write(TOY_KIND)
    folder, x = tmp_path / "folder", tmp_path / "x.pt"
    torch.save(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), x)
    fields = dict(position_embedding_type="learned_rows", interpolation_mode="bilinear", num_labels=3)
    trained = run_without_hubvit(
        f"""
        import json, sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from toykind.configuration_hubvit import HubViTConfig
        from toykind.modeling_hubvit import HubViTForImageClassification
        config = HubViTConfig(**{json.dumps({**TINY, **fields})})
        torch.manual_seed(0)
        model = HubViTForImageClassification(config)
        before = model.hubvit.embeddings.position_rows.detach().clone()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.load({str(x)!r}, weights_only=True)
        for step in range(2):  # the head starts at zero: the second step reaches the position table
            optimizer.zero_grad()
            model(x, labels=torch.tensor([0, 2])).loss.backward()
            optimizer.step()
        model.save_pretrained({str(folder)!r})
        print(json.dumps(dict(
            moved=(model.hubvit.embeddings.position_rows - before).abs().max().item(),
            rows=list(model.hubvit.embeddings.position_rows.shape),
        )))
        """,
        tmp_path,
    )
    assert trained["rows"] == [4, 32] and trained["moved"] > 0
    loaded = run_without_hubvit(
        f"""
        import json, torch, onnxruntime
        from transformers import AutoModelForImageClassification
        model, info = AutoModelForImageClassification.from_pretrained(
            {str(folder)!r}, trust_remote_code=True, output_loading_info=True)
        model.eval()
        dim = torch.export.Dim
        dynamic = {{"pixel_values": {{0: dim("batch", min=1), 2: 8 * dim("rows", min=1), 3: 8 * dim("columns", min=1)}}}}
        class Logits(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model
            def forward(self, pixel_values):
                return self.model(pixel_values).logits
        with torch.no_grad():
            program = torch.onnx.export(Logits(model), (torch.randn(2, 3, 32, 32),), dynamo=True,
                                        dynamic_shapes=dynamic, input_names=["pixel_values"], verbose=False)
        program.save({str(tmp_path / "model.onnx")!r})
        session = onnxruntime.InferenceSession({str(tmp_path / "model.onnx")!r}, providers=["CPUExecutionProvider"])
        worst = 0.0
        for height, width in ((32, 32), (48, 40)):
            pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(height))
            with torch.no_grad():
                expected = model(pixels).logits
            actual = torch.from_numpy(session.run(None, {{"pixel_values": pixels.numpy()}})[0])
            worst = max(worst, ((actual - expected).abs().max() / expected.abs().max()).item())
        print(json.dumps(dict(
            kind=type(model.hubvit.embeddings.position.kind).__name__,
            module=type(model).__module__,
            info={{k: sorted(map(str, v)) for k, v in info.items()}},
            worst=worst,
        )))
        """,
        tmp_path,
    )
    assert loaded["kind"] == "LearnedRows" and loaded["module"].startswith("transformers_modules.")
    assert not any(loaded["info"].get(key) for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert loaded["worst"] <= 1e-5


def relative_imports(path):
    return {
        node.module
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


@pytest.mark.parametrize("entry", ["configuration_hubvit", "modeling_hubvit"])
def test_the_files_transformers_loads_import_every_modeling_file_they_reach_directly(entry):
    """transformers before 5.10 copies only a loaded module's direct relative imports into its cache (then imports
    them and all they import): a file reached only through another would be missing there."""
    reached, frontier = set(), {entry}
    while frontier:
        name = frontier.pop()
        reached.add(name)
        frontier |= relative_imports(ROOT / "modeling" / f"{name}.py") - reached
    assert reached - {entry} <= relative_imports(ROOT / "modeling" / f"{entry}.py")
    assert {f"{name}.py" for name in reached} <= set(MODELING_FILES)


TOY_POOLING = '''

class MaxPooling(PoolingKind):
    """A toy pooling for the test: the channel-wise maximum over the patch tokens (big_vision's `max`)."""

    name = "max_patches"
    description = "channel-wise maximum over the patch tokens"
    takes_fc_norm = True

    @classmethod
    def pool(cls, pooler, hidden_states, attention_mask):
        return hidden_states[:, pooler.num_prefix_tokens :].amax(dim=1)
'''

TOY_MLP = '''

class SquaredReLUMLP(HubViTMLP):
    """A toy MLP kind for the test: fc1, relu(x)^2, fc2 (Primer's squared ReLU), whatever `hidden_act` says."""

    name = "squared_relu"
    description = "fc1, relu(x)^2, fc2"

    def hidden(self, hidden_states):
        return torch.relu(self.fc1(hidden_states)) ** 2
'''


@pytest.mark.heavy
def test_a_new_pooling_kind_and_a_new_mlp_kind_are_each_one_class_that_saves_and_loads_as_remote_code(tmp_path):
    """Appended to a copy of heads_hubvit.py and layers_hubvit.py (and nothing else), each kind is chosen by its
    config field, computes what it says (checked against the same sums written out from the blocks' own modules),
    and the folder loads without hubvit with the same outputs (float32, the same code path: 1e-6)."""
    package = tmp_path / "toykinds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in MODELING_FILES:
        shutil.copy(ROOT / "modeling" / name, package / name)
    with open(package / "heads_hubvit.py", "a") as handle:
        handle.write(TOY_POOLING)
    with open(package / "layers_hubvit.py", "a") as handle:
        handle.write(TOY_MLP)
    folder, x = tmp_path / "folder", tmp_path / "x.pt"
    torch.save(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), x)
    fields = dict(pooling="max_patches", fc_norm=True, mlp_type="squared_relu")
    built = run_without_hubvit(
        f"""
        import json, sys, torch
        sys.path.insert(0, {str(tmp_path)!r})
        from toykinds.configuration_hubvit import HubViTConfig
        from toykinds.modeling_hubvit import HubViTModel
        torch.manual_seed(0)
        model = HubViTModel(HubViTConfig(**{dict(TINY, **fields)!r})).eval()
        x = torch.load({str(x)!r}, weights_only=True)
        with torch.no_grad():
            out = model(x, output_hidden_states=True)
            mlp = model.encoder.layers[0].mlp
            probe = torch.randn(3, {TINY["hidden_size"]})
            by_hand = mlp.fc2(torch.relu(mlp.fc1(probe)) ** 2)
            pooled = model.pooler.fc_norm(out.last_hidden_state[:, 1:].amax(dim=1))
        model.save_pretrained({str(folder)!r})
        print(json.dumps(dict(
            mlp=type(mlp).__name__, mlp_error=(mlp(probe) - by_hand).abs().max().item(),
            pooled_error=(out.pooler_output - pooled).abs().max().item(), pooled=out.pooler_output.tolist(),
        )))
        """,
        tmp_path,
    )
    assert built["mlp"] == "SquaredReLUMLP" and built["mlp_error"] == 0.0 and built["pooled_error"] == 0.0
    loaded = run_without_hubvit(
        f"""
        import json, torch
        from transformers import AutoModel
        model, info = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True, output_loading_info=True)
        with torch.no_grad():
            pooled = model.eval()(torch.load({str(x)!r}, weights_only=True)).pooler_output
        print(json.dumps(dict(pooled=pooled.tolist(), missing=sorted(info["missing_keys"]), kind=model.pooler.kind.__name__)))
        """,
        tmp_path,
    )
    assert loaded["missing"] == [] and loaded["kind"] == "MaxPooling"
    assert_close(torch.tensor(loaded["pooled"]), torch.tensor(built["pooled"]), "pooled", rtol=1e-6)
