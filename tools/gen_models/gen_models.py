#!/usr/bin/env python3
"""Generate python/inalab/models/catalog.json: per-layer model profiles.

Pure Python, no torch. Every architecture is written out below as plain layer
shapes; parameter counts and forward FLOPs are derived from those shapes, and
the totals are asserted against published parameter counts.

Conventions
-----------
* One catalog "layer" = one gradient tensor group (a conv+BN, a residual
  block, an Inception module, a transformer encoder layer, ...). Its weight,
  bias and BN affine parameters are grouped into one tensor.
* params are float32 parameters; bytes = params * 4.
* FLOPs: 2 per multiply-accumulate of convolutions / matmuls, counted per
  sample for the forward pass. Element-wise work (ReLU, BN, softmax, adds) is
  ignored except where a layer would otherwise have no FLOPs at all
  (embeddings), where a small explicit element-wise count is used.
* Per-iteration compute time T (one worker, one iteration = one mini-batch,
  forward + backward) comes from a documented throughput: T = batch / rate.
  It is split fwd:bwd = 1:2 and across layers in proportion to forward FLOPs:
      fwd_s[i] = T/3 * flops[i] / sum(flops),  bwd_s[i] = 2T/3 * flops[i] / sum(flops)

Usage:
    python3 tools/gen_models/gen_models.py           # (re)write catalog.json
    python3 tools/gen_models/gen_models.py --check   # exit 1 if catalog.json is stale
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "python" / "inalab" / "models" / "catalog.json"

# ---------------------------------------------------------------------------
# Shape helpers. Each returns (params, fwd_flops_per_sample).
# ---------------------------------------------------------------------------


def out_size(n: int, k: int, s: int = 1, p: int = 0) -> int:
    return (n + 2 * p - k) // s + 1


def conv(cin, cout, kh, kw, hout, wout, bias=False, bn=True):
    """Conv2d (+ optional bias) (+ optional BatchNorm with affine weight+bias)."""
    params = kh * kw * cin * cout + (cout if bias else 0) + (2 * cout if bn else 0)
    flops = 2 * kh * kw * cin * cout * hout * wout
    return params, flops


def linear(fin, fout, bias=True, tokens=1):
    return fin * fout + (fout if bias else 0), 2 * fin * fout * tokens


def add(*pairs):
    return sum(p for p, _ in pairs), sum(f for _, f in pairs)


# ---------------------------------------------------------------------------
# ResNet (torchvision v1.5: stride on the 3x3 conv of a bottleneck).
# ---------------------------------------------------------------------------


def resnet(blocks_per_stage):
    layers = []
    h = out_size(224, 7, 2, 3)  # 112
    layers.append(("conv1", *conv(3, 64, 7, 7, h, h)))  # conv1 + bn1
    h = out_size(h, 3, 2, 1)  # maxpool -> 56
    inplanes = 64
    for stage, (planes, nblocks) in enumerate(zip((64, 128, 256, 512), blocks_per_stage), start=1):
        for b in range(nblocks):
            stride = 2 if (stage > 1 and b == 0) else 1
            ho = h // stride
            parts = [
                conv(inplanes, planes, 1, 1, h, h),
                conv(planes, planes, 3, 3, ho, ho),
                conv(planes, planes * 4, 1, 1, ho, ho),
            ]
            if b == 0:  # downsample projection (conv1x1 + bn)
                parts.append(conv(inplanes, planes * 4, 1, 1, ho, ho))
            layers.append((f"layer{stage}.{b}", *add(*parts)))
            inplanes = planes * 4
            h = ho
    layers.append(("fc", *linear(2048, 1000)))
    return layers


# ---------------------------------------------------------------------------
# VGG (torchvision, no BN) and AlexNet (torchvision).
# ---------------------------------------------------------------------------

VGG_CFG = {
    "vgg16": [2, 2, 3, 3, 3],
    "vgg19": [2, 2, 4, 4, 4],
}


def vgg(name):
    layers = []
    cin, h = 3, 224
    for block, (n, cout) in enumerate(zip(VGG_CFG[name], (64, 128, 256, 512, 512)), start=1):
        for i in range(1, n + 1):
            layers.append((f"conv{block}_{i}", *conv(cin, cout, 3, 3, h, h, bias=True, bn=False)))
            cin = cout
        h //= 2  # maxpool
    layers.append(("fc6", *linear(512 * 7 * 7, 4096)))
    layers.append(("fc7", *linear(4096, 4096)))
    layers.append(("fc8", *linear(4096, 1000)))
    return layers


def alexnet():
    layers = []
    h = out_size(224, 11, 4, 2)  # 55
    layers.append(("conv1", *conv(3, 64, 11, 11, h, h, bias=True, bn=False)))
    h = out_size(h, 3, 2)  # 27
    layers.append(("conv2", *conv(64, 192, 5, 5, h, h, bias=True, bn=False)))
    h = out_size(h, 3, 2)  # 13
    layers.append(("conv3", *conv(192, 384, 3, 3, h, h, bias=True, bn=False)))
    layers.append(("conv4", *conv(384, 256, 3, 3, h, h, bias=True, bn=False)))
    layers.append(("conv5", *conv(256, 256, 3, 3, h, h, bias=True, bn=False)))
    layers.append(("fc6", *linear(256 * 6 * 6, 4096)))
    layers.append(("fc7", *linear(4096, 4096)))
    layers.append(("fc8", *linear(4096, 1000)))
    return layers


# ---------------------------------------------------------------------------
# Inception v3 (torchvision, BasicConv2d = conv without bias + BN, 299x299 input).
# ---------------------------------------------------------------------------


def bc(cin, cout, k, h, w=None):
    """BasicConv2d with kernel k (int or (kh, kw)) producing an h x w map."""
    kh, kw = (k, k) if isinstance(k, int) else k
    return conv(cin, cout, kh, kw, h, h if w is None else w)


def inception_a(cin, pool_features, h=35):
    return add(
        bc(cin, 64, 1, h),
        bc(cin, 48, 1, h), bc(48, 64, 5, h),
        bc(cin, 64, 1, h), bc(64, 96, 3, h), bc(96, 96, 3, h),
        bc(cin, pool_features, 1, h),
    )


def inception_b(cin, h=35):
    ho = out_size(h, 3, 2)  # 17
    return add(
        bc(cin, 384, 3, ho),
        bc(cin, 64, 1, h), bc(64, 96, 3, h), bc(96, 96, 3, ho),
    )


def inception_c(cin, c7, h=17):
    return add(
        bc(cin, 192, 1, h),
        bc(cin, c7, 1, h), bc(c7, c7, (1, 7), h), bc(c7, 192, (7, 1), h),
        bc(cin, c7, 1, h), bc(c7, c7, (7, 1), h), bc(c7, c7, (1, 7), h),
        bc(c7, c7, (7, 1), h), bc(c7, 192, (1, 7), h),
        bc(cin, 192, 1, h),
    )


def inception_d(cin, h=17):
    ho = out_size(h, 3, 2)  # 8
    return add(
        bc(cin, 192, 1, h), bc(192, 320, 3, ho),
        bc(cin, 192, 1, h), bc(192, 192, (1, 7), h), bc(192, 192, (7, 1), h), bc(192, 192, 3, ho),
    )


def inception_e(cin, h=8):
    return add(
        bc(cin, 320, 1, h),
        bc(cin, 384, 1, h), bc(384, 384, (1, 3), h), bc(384, 384, (3, 1), h),
        bc(cin, 448, 1, h), bc(448, 384, 3, h), bc(384, 384, (1, 3), h), bc(384, 384, (3, 1), h),
        bc(cin, 192, 1, h),
    )


def inception_aux(cin, num_classes=1000, h=17):
    hp = out_size(h, 5, 3)  # avg_pool2d(5, stride 3): 17 -> 5
    return add(bc(cin, 128, 1, hp), bc(128, 768, 5, 1), linear(768, num_classes))


def inception_v3(aux_logits=True):
    h1 = out_size(299, 3, 2)  # 149
    h2 = out_size(h1, 3)  # 147
    h3 = out_size(h2, 3, 2)  # maxpool -> 73
    h4 = out_size(h3, 3)  # 71
    layers = [
        ("Conv2d_1a_3x3", *bc(3, 32, 3, h1)),
        ("Conv2d_2a_3x3", *bc(32, 32, 3, h2)),
        ("Conv2d_2b_3x3", *bc(32, 64, 3, h2)),
        ("Conv2d_3b_1x1", *bc(64, 80, 1, h3)),
        ("Conv2d_4a_3x3", *bc(80, 192, 3, h4)),
        ("Mixed_5b", *inception_a(192, 32)),
        ("Mixed_5c", *inception_a(256, 64)),
        ("Mixed_5d", *inception_a(288, 64)),
        ("Mixed_6a", *inception_b(288)),
        ("Mixed_6b", *inception_c(768, 128)),
        ("Mixed_6c", *inception_c(768, 160)),
        ("Mixed_6d", *inception_c(768, 160)),
        ("Mixed_6e", *inception_c(768, 192)),
    ]
    if aux_logits:  # torchvision runs AuxLogits right after Mixed_6e in training
        layers.append(("AuxLogits", *inception_aux(768)))
    layers += [
        ("Mixed_7a", *inception_d(768)),
        ("Mixed_7b", *inception_e(1280)),
        ("Mixed_7c", *inception_e(2048)),
        ("fc", *linear(2048, 1000)),
    ]
    return layers


# ---------------------------------------------------------------------------
# BERT-base (HuggingFace BertModel, bert-base-uncased config), sequence length 128.
# ---------------------------------------------------------------------------

BERT_SEQ = 128


def bert_base(seq=BERT_SEQ):
    vocab, hidden, n_layers, inter, max_pos, type_vocab = 30522, 768, 12, 3072, 512, 2
    layers = []
    emb_params = (vocab + max_pos + type_vocab) * hidden + 2 * hidden  # 3 tables + LayerNorm
    # No matmuls: 2 adds + LayerNorm (~5 ops) per element; <0.01% of the model's FLOPs.
    layers.append(("embeddings", emb_params, 7 * seq * hidden))
    for i in range(n_layers):
        qkv = linear(hidden, 3 * hidden, tokens=seq)
        attn_out = linear(hidden, hidden, tokens=seq)
        ffn_in = linear(hidden, inter, tokens=seq)
        ffn_out = linear(inter, hidden, tokens=seq)
        ln = (2 * hidden, 0)
        scores_ctx = (0, 2 * 2 * seq * seq * hidden)  # QK^T and attn.V over all heads
        layers.append((f"encoder.layer.{i}", *add(qkv, attn_out, ln, ffn_in, ffn_out, ln, scores_ctx)))
    layers.append(("pooler", *linear(hidden, hidden, tokens=1)))  # first token only
    return layers


# ---------------------------------------------------------------------------
# LSTM language model: PyTorch examples word_language_model, "large" tied config:
#   main.py --emsize 1500 --nhid 1500 --nlayers 2 --tied on Wikitext-2 (vocab 33,278),
#   batch_size 20, bptt 35 (the example's defaults).
# ---------------------------------------------------------------------------

LSTM_VOCAB, LSTM_HIDDEN, LSTM_LAYERS, LSTM_BATCH, LSTM_BPTT = 33278, 1500, 2, 20, 35


def lstm_lm(tokens=LSTM_BPTT):
    v, h = LSTM_VOCAB, LSTM_HIDDEN
    layers = [("encoder", v * h, h * tokens)]  # embedding lookup; weight shared with decoder (tied)
    for i in range(LSTM_LAYERS):
        # nn.LSTM: weight_ih (4h x in), weight_hh (4h x h), bias_ih (4h), bias_hh (4h)
        params = 4 * h * (h + h) + 2 * 4 * h
        flops = 2 * 4 * h * (h + h) * tokens + 10 * h * tokens  # gates matmuls + cell element-wise
        layers.append((f"rnn.l{i}", params, flops))
    # Tied: the decoder's weight is the encoder's tensor; only its bias is a separate gradient.
    layers.append(("decoder", v, 2 * h * v * tokens))
    return layers


def lstm_weights_only():
    v, h = LSTM_VOCAB, LSTM_HIDDEN
    return v * h + LSTM_LAYERS * 4 * h * (h + h)


# ---------------------------------------------------------------------------
# Published parameter counts (asserted).
# ---------------------------------------------------------------------------

PUBLISHED_PARAMS = {
    "resnet50": (25_557_032, "torchvision resnet50 parameter count"),
    "resnet101": (44_549_160, "torchvision resnet101 parameter count"),
    "resnet152": (60_192_808, "torchvision resnet152 parameter count"),
    "vgg16": (138_357_544, "torchvision vgg16 parameter count"),
    "vgg19": (143_667_240, "torchvision vgg19 parameter count"),
    "alexnet": (61_100_840, "torchvision alexnet parameter count"),
    "inception_v3": (27_161_264, "torchvision inception_v3 with aux_logits=True "
                                 "(23,834,568 without AuxLogits)"),
    "bert_base": (109_482_240, "HuggingFace BertModel(bert-base-uncased) incl. pooler "
                               "(108,891,648 without pooler); pre-training/task heads excluded"),
    "lstm": (85_974_278, "weights-only count 85,917,000 as published in the IntelLabs Distiller "
                         "word-language-model AGP tutorial ('large', tied, Wikitext-2), plus LSTM "
                         "biases 2x2x6,000 and decoder bias 33,278 (PyTorch nn.LSTM/nn.Linear)"),
}
INCEPTION_V3_NO_AUX = 23_834_568
BERT_NO_POOLER = 108_891_648
LSTM_WEIGHTS_ONLY = 85_917_000

# ---------------------------------------------------------------------------
# Compute-time references.
# ---------------------------------------------------------------------------

TF_BENCH = ("TensorFlow 'Benchmarks' page (tensorflow.org/performance/benchmarks, May 2017; "
            "tensorflow/docs site/en/r1/guide/performance/benchmarks.md), NVIDIA DGX-1, 1x Tesla P100, "
            "tf_cnn_benchmarks, training, synthetic data, FP32")
P100 = "NVIDIA Tesla P100 (DGX-1)"

# (images/s, batch) from the TF_BENCH '1 GPU, training synthetic data' row.
MEASURED = {
    "inception_v3": (142.0, 64),
    "resnet50": (219.0, 64),
    "resnet152": (91.8, 64),
    "alexnet": (2987.0, 512),
    "vgg16": (154.0, 64),
}

DSA_LINK_BPS = 100e9  # DSA §VII-B simulation: 100 Gbps links, ideal INA


def sig(x: float, n: int) -> float:
    """Round x to n significant digits."""
    if x == 0:
        return 0.0
    return round(x, -int(math.floor(math.log10(abs(x)))) + (n - 1))


def split_times(layers, iteration_s):
    total = sum(f for _, _, f in layers)
    out = []
    for name, params, flops in layers:
        frac = flops / total
        out.append({
            "name": name,
            "params": params,
            "fwd_s": iteration_s / 3.0 * frac,
            "bwd_s": iteration_s * 2.0 / 3.0 * frac,
        })
    return out


def model_entry(name, description, layers, params_reference, source, gpu, batch, iteration_s,
                fwd_flops_per_sample):
    total_params = sum(p for _, p, _ in layers)
    return {
        "name": name,
        "description": description,
        "total_params": total_params,
        "total_bytes": total_params * 4,
        "params_reference": params_reference,
        "source": source,
        "reference_gpu": gpu,
        "batch_size": batch,
        "iteration_compute_s": iteration_s,
        "fwd_flops_per_sample": fwd_flops_per_sample,
        "layers": split_times(layers, iteration_s),
    }


def dsa_model(name, partition_params, layer_compute_s, ratio):
    """DSA §VII-B synthetic DNN: 2 equal layers x 2 equal tensor partitions."""
    layers = []
    for layer in (1, 2):
        for part in (0, 1):
            layers.append({
                "name": f"layer{layer}.part{part}",
                "params": partition_params,
                "fwd_s": layer_compute_s / 2 / 3.0,
                "bwd_s": layer_compute_s / 2 * 2.0 / 3.0,
            })
    total_params = 4 * partition_params
    total_bytes = total_params * 4
    comp = 2 * layer_compute_s
    comm = total_bytes * 8 / DSA_LINK_BPS
    assert math.isclose(comm / comp, ratio, rel_tol=1e-12), (name, comm / comp)
    mb = partition_params * 4 / 1e6
    return {
        "name": name,
        "description": (
            f"DSA synthetic DNN {name[-1].upper()}: 2 layers of equal size, each split into 2 tensor "
            f"partitions of {mb:g} MB ({partition_params:,} float32 params); "
            f"{layer_compute_s * 1e3:g} ms compute (fwd+bwd) per layer, split fwd:bwd 1:2 and "
            f"evenly between a layer's two partitions. Comm/Comp = {ratio:g} where "
            f"Comm = total_bytes*8 / 100 Gbps (ideal INA: each worker sends and receives the "
            f"model once, headers ignored) = {comm * 1e3:g} ms and Comp = sum(fwd+bwd) = "
            f"{comp * 1e3:g} ms."
        ),
        "total_params": total_params,
        "total_bytes": total_bytes,
        "params_reference": "DSA §VII-B (partition size, MB read as 10^6 bytes)",
        "source": (
            "DSA paper §VII-B 'Workloads': DNN A has 4 MB tensor partitions and 0.32 ms computation "
            "per layer (comm:comp = 2:1); DNN B has 2 MB partitions and 0.64 ms per layer (1:2). "
            "'MB' taken as 10^6 bytes, which makes the stated ratios exact at 100 Gbps "
            "(with MiB they would be 2.10 and 0.52)."
        ),
        "reference_gpu": None,
        "batch_size": None,
        "iteration_compute_s": comp,
        "fwd_flops_per_sample": None,
        "layers": layers,
    }


def build():
    archs = {
        "resnet50": resnet([3, 4, 6, 3]),
        "resnet101": resnet([3, 4, 23, 3]),
        "resnet152": resnet([3, 8, 36, 3]),
        "vgg16": vgg("vgg16"),
        "vgg19": vgg("vgg19"),
        "alexnet": alexnet(),
        "inception_v3": inception_v3(aux_logits=True),
        "bert_base": bert_base(),
        "lstm": lstm_lm(),
    }

    # --- parameter-count checks against published totals ---
    for name, layers in archs.items():
        total = sum(p for _, p, _ in layers)
        want = PUBLISHED_PARAMS[name][0]
        assert total == want, f"{name}: computed {total:,} params, published {want:,}"
        assert all(p > 0 and f > 0 for _, p, f in layers), name
    no_aux = sum(p for _, p, _ in inception_v3(aux_logits=False))
    assert no_aux == INCEPTION_V3_NO_AUX, no_aux
    no_pooler = sum(p for n, p, _ in archs["bert_base"] if n != "pooler")
    assert no_pooler == BERT_NO_POOLER, no_pooler
    assert lstm_weights_only() == LSTM_WEIGHTS_ONLY, lstm_weights_only()

    fwd_flops = {name: sum(f for _, _, f in layers) for name, layers in archs.items()}

    # --- compute times ---
    timing = {}
    for name, (rate, batch) in MEASURED.items():
        t = sig(batch / rate, 3)
        timing[name] = (
            f"measured: {TF_BENCH}: {rate:g} images/s at batch {batch} per GPU; "
            f"iteration = {batch}/{rate:g} s (3 significant digits). The TF implementation "
            "differs slightly from the torchvision shapes used for params/FLOPs "
            "(e.g. ResNet v1 vs v1.5 stride placement).",
            P100, batch, t)

    r50_rate, r50_batch = MEASURED["resnet50"]
    r152_rate, _ = MEASURED["resnet152"]
    t50, t152 = 1 / r50_rate, 1 / r152_rate  # seconds per image
    f50, f152, f101 = fwd_flops["resnet50"], fwd_flops["resnet152"], fwd_flops["resnet101"]
    t101 = t50 + (f101 - f50) * (t152 - t50) / (f152 - f50)
    timing["resnet101"] = (
        "estimate: not in the TF benchmark table; per-image time interpolated linearly in forward "
        f"FLOPs between the measured ResNet-50 ({r50_rate:g} img/s) and ResNet-152 ({r152_rate:g} img/s) "
        f"on the same P100 ({TF_BENCH}), batch 64; 2 significant digits.",
        P100, 64, sig(64 * t101, 2))

    v16_rate, _ = MEASURED["vgg16"]
    t19 = (1 / v16_rate) * fwd_flops["vgg19"] / fwd_flops["vgg16"]
    timing["vgg19"] = (
        "estimate: not in the TF benchmark table; measured VGG16 per-image time "
        f"({v16_rate:g} img/s, {TF_BENCH}) scaled by the VGG19/VGG16 forward-FLOP ratio "
        f"({fwd_flops['vgg19'] / fwd_flops['vgg16']:.3f}), batch 64; 2 significant digits.",
        P100, 64, sig(64 * t19, 2))

    # Achieved FP32 training rate of ResNet-50 on the P100 (fwd+bwd = 3x forward FLOPs).
    achieved = 3 * f50 * r50_rate
    bert_batch = 32
    t_bert = 3 * fwd_flops["bert_base"] * bert_batch / achieved
    timing["bert_base"] = (
        f"estimate: no single-P100 FP32 BERT-base measurement found; training FLOPs "
        f"(3 x forward = {3 * fwd_flops['bert_base'] / 1e9:.1f} GFLOP per sequence of {BERT_SEQ} tokens, "
        f"BertModel without pre-training heads) divided by the achieved rate of ResNet-50 on the "
        f"same P100 ({achieved / 1e12:.2f} TFLOP/s = 3 x {f50 / 1e9:.2f} GFLOP x {r50_rate:g} img/s, "
        f"{TF_BENCH}); batch {bert_batch} x seq {BERT_SEQ}; 2 significant digits. Assumes BERT "
        "reaches the same FLOP efficiency as ResNet-50; treat as +/-50%.",
        P100, bert_batch, sig(t_bert, 2))

    t_lstm = 3 * fwd_flops["lstm"] * LSTM_BATCH / achieved
    timing["lstm"] = (
        f"estimate: no published per-iteration time for this model; training FLOPs "
        f"(3 x forward = {3 * fwd_flops['lstm'] / 1e9:.1f} GFLOP per {LSTM_BPTT}-token sequence) divided "
        f"by the achieved ResNet-50 rate on the same P100 ({achieved / 1e12:.2f} TFLOP/s, {TF_BENCH}); "
        f"batch {LSTM_BATCH} x bptt {LSTM_BPTT}; 2 significant digits. cuDNN LSTMs at batch 20 usually "
        "reach lower FLOP efficiency than CNNs, so this is likely an underestimate (possibly 2x).",
        P100, LSTM_BATCH, sig(t_lstm, 2))

    desc = {
        "resnet50": "ResNet-50 (torchvision), ImageNet 224x224: stem, 16 bottleneck blocks, fc",
        "resnet101": "ResNet-101 (torchvision), ImageNet 224x224: stem, 33 bottleneck blocks, fc",
        "resnet152": "ResNet-152 (torchvision), ImageNet 224x224: stem, 50 bottleneck blocks, fc",
        "vgg16": "VGG16 (torchvision, no BN), ImageNet 224x224: 13 conv + 3 fc",
        "vgg19": "VGG19 (torchvision, no BN), ImageNet 224x224: 16 conv + 3 fc",
        "alexnet": "AlexNet (torchvision variant), ImageNet 224x224: 5 conv + 3 fc",
        "inception_v3": ("Inception v3 (torchvision, aux_logits=True), ImageNet 299x299: 5 stem convs, "
                         "11 Inception modules, AuxLogits (after Mixed_6e, as in training), fc"),
        "bert_base": (f"BERT-base uncased (HuggingFace BertModel: vocab 30522, hidden 768, 12 layers, "
                      f"12 heads, intermediate 3072, max pos 512, type vocab 2), seq len {BERT_SEQ}: "
                      "embeddings, 12 encoder layers, pooler; task/pre-training heads excluded"),
        "lstm": (f"2-layer LSTM language model, PyTorch examples word_language_model "
                 f"(--emsize 1500 --nhid 1500 --tied), Wikitext-2 vocab {LSTM_VOCAB}: encoder embedding "
                 "(shared with the decoder weight), 2 LSTM layers, decoder bias; the decoder layer's "
                 "compute is the 1500x33278 output projection"),
    }

    models = {}
    for name, layers in archs.items():
        source, gpu, batch, t = timing[name]
        models[name] = model_entry(name, desc[name], layers, PUBLISHED_PARAMS[name][1], source, gpu,
                                   batch, t, fwd_flops[name])
    models["dnn_a"] = dsa_model("dnn_a", 1_000_000, 0.32e-3, 2.0)
    models["dnn_b"] = dsa_model("dnn_b", 500_000, 0.64e-3, 0.5)

    return {
        "schema": "inalab.models.catalog/1",
        "generated_by": "tools/gen_models/gen_models.py",
        "notes": ("params: float32 gradient elements per layer (weight+bias+BN grouped); bytes = params*4. "
                  "Layers in forward order. fwd_s/bwd_s: seconds per iteration on one worker; "
                  "fwd:bwd = 1:2, split across layers by forward FLOPs."),
        "models": models,
    }


def render(catalog) -> str:
    return json.dumps(catalog, indent=1) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if catalog.json is not up to date")
    ap.add_argument("--out", type=Path, default=CATALOG)
    args = ap.parse_args(argv)
    text = render(build())
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale; rerun tools/gen_models/gen_models.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.write_text(text)
    cat = json.loads(text)
    for m in cat["models"].values():
        print(f"{m['name']:13s} {len(m['layers']):3d} layers {m['total_params']:>12,} params "
              f"{m['total_bytes'] / 1e6:9.2f} MB  iter {m['iteration_compute_s'] * 1e3:9.3f} ms")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
