"""Tests for the model-profile catalog (inalab.models). Run with PYTHONPATH=python."""
import importlib.util
import math
from pathlib import Path

import pytest

from inalab.models import Layer, ModelProfile, get_model, list_models

REPO = Path(__file__).resolve().parents[2]

PUBLISHED = {
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "alexnet": 61_100_840,
    "inception_v3": 27_161_264,  # torchvision, aux_logits=True
    "bert_base": 109_482_240,  # HF BertModel incl. pooler
    "lstm": 85_974_278,  # word_language_model large tied: 85,917,000 weights + biases
    "dnn_a": 4_000_000,
    "dnn_b": 2_000_000,
}

LINK_BPS = 100e9  # DSA §VII-B


def test_catalog_lists_all_required_models():
    assert list_models() == list(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_totals_match_published(name):
    m = get_model(name)
    assert isinstance(m, ModelProfile)
    assert m.total_params == PUBLISHED[name]
    assert sum(l.params for l in m.layers) == m.total_params
    assert m.total_bytes == 4 * m.total_params
    assert sum(l.bytes for l in m.layers) == m.total_bytes


def test_inception_without_aux_and_bert_without_pooler():
    inc = get_model("inception_v3")
    aux = [l for l in inc.layers if l.name == "AuxLogits"]
    assert len(aux) == 1 and inc.total_params - aux[0].params == 23_834_568
    bert = get_model("bert_base")
    assert bert.total_params - bert.layers[-1].params == 108_891_648


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_layers_positive_and_times_sum(name):
    m = get_model(name)
    assert isinstance(m.layers, tuple) and all(isinstance(l, Layer) for l in m.layers)
    assert 4 <= len(m.layers) <= 60
    assert len({l.name for l in m.layers}) == len(m.layers)
    for l in m.layers:
        assert l.params > 0 and l.fwd_s > 0 and l.bwd_s > 0
        assert l.bwd_s == pytest.approx(2 * l.fwd_s, rel=1e-9)
    assert m.fwd_s + m.bwd_s == pytest.approx(m.iteration_compute_s, rel=1e-9)
    assert m.source and (m.reference_gpu is None) == (m.batch_size is None)
    if name not in ("dnn_a", "dnn_b"):
        assert m.reference_gpu and m.batch_size > 0


def test_forward_order():
    def names(n):
        return [l.name for l in get_model(n).layers]

    r50 = names("resnet50")
    assert r50[0] == "conv1" and r50[-1] == "fc" and len(r50) == 18
    blocks = [tuple(map(int, n[len("layer"):].split("."))) for n in r50[1:-1]]
    assert blocks == sorted(blocks) and len(blocks) == 16
    assert len(names("resnet101")) == 35 and len(names("resnet152")) == 52
    assert names("vgg16") == [f"conv{b}_{i}" for b, n in enumerate([2, 2, 3, 3, 3], 1)
                              for i in range(1, n + 1)] + ["fc6", "fc7", "fc8"]
    assert len(names("vgg19")) == 19
    assert names("alexnet") == ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"]
    inc = names("inception_v3")
    assert inc[0] == "Conv2d_1a_3x3" and inc[-1] == "fc"
    assert inc.index("Mixed_5b") < inc.index("Mixed_6e") < inc.index("AuxLogits") < inc.index("Mixed_7a")
    assert names("bert_base") == ["embeddings"] + [f"encoder.layer.{i}" for i in range(12)] + ["pooler"]
    assert names("lstm") == ["encoder", "rnn.l0", "rnn.l1", "decoder"]
    for n in ("dnn_a", "dnn_b"):
        assert names(n) == ["layer1.part0", "layer1.part1", "layer2.part0", "layer2.part1"]


@pytest.mark.parametrize("name,ratio,part_bytes,layer_comp_s",
                         [("dnn_a", 2.0, 4_000_000, 0.32e-3), ("dnn_b", 0.5, 2_000_000, 0.64e-3)])
def test_dsa_comm_comp_ratio(name, ratio, part_bytes, layer_comp_s):
    m = get_model(name)
    # Documented formula: Comm = model bytes * 8 / 100 Gbps (ideal INA); Comp = sum(fwd + bwd).
    comm = m.total_bytes * 8 / LINK_BPS
    comp = sum(l.fwd_s + l.bwd_s for l in m.layers)
    assert comm / comp == pytest.approx(ratio, rel=1e-12)
    assert all(l.bytes == part_bytes for l in m.layers)
    for layer in ("layer1", "layer2"):
        parts = [l for l in m.layers if l.name.startswith(layer + ".")]
        assert sum(l.fwd_s + l.bwd_s for l in parts) == pytest.approx(layer_comp_s, rel=1e-12)
    assert len({(l.params, l.fwd_s, l.bwd_s) for l in m.layers}) == 1


def test_unknown_model_error_names_field_and_allowed_values():
    with pytest.raises(ValueError) as exc:
        get_model("resnet9000")
    msg = str(exc.value)
    assert msg.startswith("model:")
    assert "resnet9000" in msg
    for name in list_models():
        assert name in msg


def test_scaled():
    m = get_model("vgg16")
    s = m.scaled(0.5)
    assert s.iteration_compute_s == pytest.approx(m.iteration_compute_s * 0.5)
    assert s.total_bytes == m.total_bytes and [l.params for l in s.layers] == [l.params for l in m.layers]
    for a, b in zip(m.layers, s.layers):
        assert b.fwd_s == pytest.approx(a.fwd_s * 0.5) and b.bwd_s == pytest.approx(a.bwd_s * 0.5)
    assert m.scaled(1.0) == m
    assert get_model("vgg16").iteration_compute_s == m.iteration_compute_s  # original untouched
    for bad in (0, -1.0, math.inf, math.nan, "2"):
        with pytest.raises(ValueError, match="^compute_scale:"):
            m.scaled(bad)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_to_workload(name):
    m = get_model(name)
    wl = m.to_workload()
    assert [w["name"] for w in wl] == [l.name for l in m.layers]
    for w, l in zip(wl, m.layers):
        assert set(w) == {"name", "bytes", "fwd_ps", "bwd_ps", "group"}
        assert all(isinstance(w[k], int) and w[k] > 0 for k in ("bytes", "fwd_ps", "bwd_ps", "group"))
        assert w["bytes"] == 4 * l.params
    total_ps = sum(w["fwd_ps"] + w["bwd_ps"] for w in wl)
    assert abs(total_ps - m.iteration_compute_s * 1e12) <= len(wl)  # <= 0.5 ps rounding per value
    # Model layers in forward order, starting at 1, never skipping.
    groups = [w["group"] for w in wl]
    assert groups[0] == 1 and all(b - a in (0, 1) for a, b in zip(groups, groups[1:]))


def test_partitions_share_their_layer():
    # DSA's DNN A: two layers of two partitions each (its priority's l and L).
    assert [w["group"] for w in get_model("dnn_a").to_workload()] == [1, 1, 2, 2]
    assert [w["group"] for w in get_model("vgg16").to_workload()][:3] == [1, 2, 3]


def test_catalog_json_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_models", REPO / "tools/gen_models/gen_models.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = gen.render(gen.build())  # build() also asserts the published totals
    assert (REPO / "python/inalab/models/catalog.json").read_text() == expected
