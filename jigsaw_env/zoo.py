"""Reference model zoo for cost tables and the live executor, in plain PyTorch (no torchvision).

Every model is an :class:`ZooModel`: an ``nn.Module`` whose ``groups`` (an ``nn.ModuleList``) are
its SPB layer groups, ordered from the input (index 0) to the output (index ``B-1``), cut at natural
block boundaries (docs/design.md section 2). ``forward(x)`` applies the groups in sequence; each group
takes one tensor and returns one tensor, so a worker that starts backprop at group ``s`` can run
groups ``0..s-1`` under ``torch.no_grad()`` and the rest with gradients.

Besides the groups each model provides:

* ``make_batch(batch_size, generator=None, device=None) -> (inputs, targets)``: synthetic data of
  the right shape and dtype (random images, token ids, user/item ids, ...);
* ``loss(output, targets) -> scalar``;
* ``make_optimizer(params=None)``: the optimizer its reference training script uses
  (``optimizer_name`` says which), and ``grad_clip`` (max gradient norm or ``None``);
* ``input_is_index``: True when group 0 takes integer indices (no input gradient exists);
* ``gavel_job``: the Gavel job type it stands for (``"ResNet-18"``, ...) or ``None``;
* ``group_names``: one name per group.

Build one with :func:`build_model` (``MODELS`` maps names to constructors).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ZooModel", "MODELS", "build_model", "model_names"]


# --------------------------------------------------------------------------------------------
# base class
# --------------------------------------------------------------------------------------------
class ZooModel(nn.Module):
    """A model cut into ordered layer groups. Subclasses fill ``groups`` and ``group_names``."""

    name: str = "zoo"
    gavel_job: str | None = None          # Gavel job type ("ResNet-18", ...) this model stands for
    input_is_index: bool = False          # group 0 takes integer ids: no input gradient exists
    optimizer_name: str = "sgd_momentum"  # "sgd_momentum" | "sgd" | "adam" | "adamw"
    lr: float = 0.1
    grad_clip: float | None = None        # clip_grad_norm_ max norm applied before the step

    def __init__(self) -> None:
        super().__init__()
        self.groups = nn.ModuleList()
        self.group_names: list[str] = []

    def add_group(self, name: str, module: nn.Module) -> None:
        self.groups.append(module)
        self.group_names.append(name)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D401 - standard nn.Module API
        for g in self.groups:
            x = g(x)
        return x

    # ----- data and objective -----
    def make_batch(self, batch_size: int, generator: torch.Generator | None = None,
                   device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, targets)

    # ----- optimizer -----
    def make_optimizer(self, params=None) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad] if params is None else params
        if self.optimizer_name == "sgd_momentum":
            return torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=5e-4)
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr)
        if self.optimizer_name == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=0.01)
        raise ValueError(f"{self.name}: unknown optimizer {self.optimizer_name!r}")

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """One parameter update as the reference script does it (clip, then step)."""
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([p for p in self.parameters() if p.grad is not None],
                                           self.grad_clip)
        optimizer.step()


def _randn(shape, generator, device, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=dtype).to(device) if device else \
        torch.randn(*shape, generator=generator, dtype=dtype)


def _randint(high, shape, generator, device) -> torch.Tensor:
    t = torch.randint(0, high, shape, generator=generator, dtype=torch.long)
    return t.to(device) if device else t


class _Seq(nn.Sequential):
    """nn.Sequential used as one group (kept for readable reprs)."""


# --------------------------------------------------------------------------------------------
# ResNets
# --------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        out_planes = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # stride on the 3x3 (v1.5)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_planes)
        self.downsample = nn.Sequential()
        if stride != 1 or in_planes != out_planes:
            self.downsample = nn.Sequential(nn.Conv2d(in_planes, out_planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(out_planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.downsample(x))


class _ImageClassifier(ZooModel):
    image_shape: tuple[int, int, int] = (3, 224, 224)
    num_classes: int = 1000

    def make_batch(self, batch_size, generator=None, device=None):
        x = _randn((batch_size, *self.image_shape), generator, device)
        y = _randint(self.num_classes, (batch_size,), generator, device)
        return x, y


class ResNet18Cifar(_ImageClassifier):
    """CIFAR-10 ResNet-18 (He et al., CVPR 2016; the kuangliu/pytorch-cifar variant that Gavel's
    "ResNet-18" job type trains: 3x3 stem, no max-pool, 4x4 average pool, 10 classes).

    Input: float images ``[B, 3, 32, 32]``; targets: int64 ``[B]`` in ``0..9``.
    Groups (10): ``stem`` (conv3x3+BN+ReLU), the 8 BasicBlocks ``layer1.0 .. layer4.1``, ``head``
    (average pool + fc). Optimizer: SGD, momentum 0.9 (as Gavel's cifar10/main.py).
    """

    name = "resnet18"
    gavel_job = "ResNet-18"
    image_shape = (3, 32, 32)
    num_classes = 10

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.add_group("stem", _Seq(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()))
        in_planes = 64
        for li, (planes, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
            for bi in range(2):
                self.add_group(f"layer{li}.{bi}", BasicBlock(in_planes, planes, stride if bi == 0 else 1))
                in_planes = planes
        self.add_group("head", _Seq(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)))


class ResNet50(_ImageClassifier):
    """ImageNet ResNet-50 (He et al., CVPR 2016; torchvision's v1.5 layout, stride on the 3x3 conv),
    Gavel's "ResNet-50" job type (imagenet/main.py -a resnet50).

    Input: float images ``[B, 3, 224, 224]``; targets: int64 ``[B]`` in ``0..999``.
    Groups (18): ``stem`` (conv7x7/2+BN+ReLU+maxpool), the 16 Bottleneck blocks
    ``layer1.0 .. layer4.2``, ``head`` (average pool + fc). Optimizer: SGD, momentum 0.9.
    """

    name = "resnet50"
    gavel_job = "ResNet-50"

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.add_group("stem", _Seq(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                    nn.MaxPool2d(3, 2, 1)))
        in_planes = 64
        for li, (planes, n, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)], start=1):
            for bi in range(n):
                self.add_group(f"layer{li}.{bi}", Bottleneck(in_planes, planes, stride if bi == 0 else 1))
                in_planes = planes * Bottleneck.expansion
        self.add_group("head", _Seq(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes)))


class VGG16(_ImageClassifier):
    """ImageNet VGG-16, configuration D without batch norm (Simonyan & Zisserman, ICLR 2015; the
    torchvision layout). Not a Gavel job type: its GPU tables are extrapolated.

    Input: float images ``[B, 3, 224, 224]``; targets: int64 ``[B]`` in ``0..999``.
    Groups (8): the 5 conv stages ``conv1 .. conv5`` (each ending with its max-pool), then the
    classifier split at its fully connected layers: ``fc6`` (avg-pool to 7x7 + flatten + Linear
    25088->4096 + ReLU + Dropout), ``fc7`` (Linear 4096->4096 + ReLU + Dropout), ``fc8``
    (Linear 4096->1000). Optimizer: SGD, momentum 0.9.
    """

    name = "vgg16"

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.num_classes = num_classes
        cfg = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]
        c_in = 3
        for si, stage in enumerate(cfg, start=1):
            layers: list[nn.Module] = []
            for c in stage:
                layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(inplace=True)]
                c_in = c
            layers.append(nn.MaxPool2d(2, 2))
            self.add_group(f"conv{si}", _Seq(*layers))
        self.add_group("fc6", _Seq(nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(), nn.Linear(512 * 7 * 7, 4096),
                                   nn.ReLU(inplace=True), nn.Dropout(0.5)))
        self.add_group("fc7", _Seq(nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5)))
        self.add_group("fc8", _Seq(nn.Linear(4096, num_classes)))
        self.lr = 0.01


# --------------------------------------------------------------------------------------------
# Transformers
# --------------------------------------------------------------------------------------------
class _EncoderLayer(nn.Module):
    """``nn.TransformerEncoderLayer`` (batch_first) with an optional fixed causal mask."""

    def __init__(self, d_model: int, nhead: int, d_ff: int, dropout: float, activation: str,
                 causal_len: int | None = None) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, nhead, d_ff, dropout, activation=activation,
                                                batch_first=True)
        if causal_len:
            mask = torch.triu(torch.full((causal_len, causal_len), float("-inf")), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)
        else:
            self.mask = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask is None:
            return self.layer(x)
        t = x.shape[1]
        return self.layer(x, src_mask=self.mask[:t, :t], is_causal=True)


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_pos: int, type_vocab: int, dropout: float) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_pos, hidden)
        self.token_type = nn.Embedding(type_vocab, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.word(ids) + self.position(pos)[None] + self.token_type.weight[0]
        return self.drop(self.norm(x))


class BertHead(nn.Module):
    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(hidden, hidden)
        self.drop = nn.Dropout(0.1)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(self.drop(pooled))


class BertBase(ZooModel):
    """BERT-base-sized encoder with a sequence-classification head (Devlin et al., NAACL 2019:
    12 layers, hidden 768, 12 heads, FFN 3072, GELU, post-LayerNorm, vocab 30522, 512 positions),
    fine-tuning style (2 labels). Built from ``nn.TransformerEncoderLayer``. Not a Gavel job type
    (Pollux's "bert" workload is the closest public profile): its GPU tables are extrapolated.

    Input: int64 token ids ``[B, 128]``; targets: int64 ``[B]`` in ``0..1``.
    Groups (14): ``embeddings`` (word + position + token-type + LayerNorm + dropout),
    ``encoder.0 .. encoder.11``, ``head`` (pooler on [CLS] + tanh + classifier).
    Optimizer: AdamW.
    """

    name = "bert_base"
    input_is_index = True
    optimizer_name = "adamw"
    lr = 2e-5

    def __init__(self, vocab: int = 30522, hidden: int = 768, layers: int = 12, heads: int = 12,
                 d_ff: int = 3072, seq_len: int = 128, num_labels: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.vocab, self.seq_len, self.num_labels = vocab, seq_len, num_labels
        self.add_group("embeddings", BertEmbeddings(vocab, hidden, 512, 2, dropout))
        for i in range(layers):
            self.add_group(f"encoder.{i}", _EncoderLayer(hidden, heads, d_ff, dropout, "gelu"))
        self.add_group("head", BertHead(hidden, num_labels))

    def make_batch(self, batch_size, generator=None, device=None):
        return (_randint(self.vocab, (batch_size, self.seq_len), generator, device),
                _randint(self.num_labels, (batch_size,), generator, device))


class TokenEmbedding(nn.Module):
    """Token embedding scaled by sqrt(d_model) + fixed sinusoidal positions + dropout."""

    def __init__(self, vocab: int, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.scale = math.sqrt(d_model)
        pos = torch.arange(max_len, dtype=torch.float32)[:, None]
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.emb(ids) * self.scale + self.pe[: ids.shape[1]])


class TransformerSmall(ZooModel):
    """Transformer language model standing for Gavel's "Transformer" job type.

    Gavel's job trains the attention-is-all-you-need-pytorch encoder-decoder on Multi30k
    (d_model 512, 8 heads, FFN 2048, 6+6 layers, Adam). Groups must form one chain of tensors, so
    this stand-in is a causal (decoder-only style) stack of 6 ``nn.TransformerEncoderLayer`` layers
    with Gavel's per-layer geometry (d_model 512, 8 heads, FFN 2048, ReLU, dropout 0.1), a
    10,000-token vocabulary (about Multi30k's target vocabulary), sequence length 52 (Multi30k's
    max token length after preprocessing: 50 words + BOS/EOS, so activation bytes are an upper
    bound), and a per-token vocabulary projection. It has roughly half the layer parameters of
    Gavel's model (no decoder stack); its GPU iteration time is anchored to Gavel's throughput.

    Input: int64 token ids ``[B, 52]``; targets: int64 ``[B, 52]`` (next tokens).
    Groups (8): ``embeddings``, ``layer.0 .. layer.5``, ``head`` (Linear d_model->vocab).
    Optimizer: Adam (as Gavel's translation/train.py).
    """

    name = "transformer_small"
    gavel_job = "Transformer"
    input_is_index = True
    optimizer_name = "adam"
    lr = 1e-4

    def __init__(self, vocab: int = 10000, d_model: int = 512, layers: int = 6, heads: int = 8,
                 d_ff: int = 2048, seq_len: int = 52, dropout: float = 0.1) -> None:
        super().__init__()
        self.vocab, self.seq_len = vocab, seq_len
        self.add_group("embeddings", TokenEmbedding(vocab, d_model, max(seq_len, 512), dropout))
        for i in range(layers):
            self.add_group(f"layer.{i}", _EncoderLayer(d_model, heads, d_ff, dropout, "relu", causal_len=seq_len))
        self.add_group("head", _Seq(nn.Linear(d_model, vocab)))

    def make_batch(self, batch_size, generator=None, device=None):
        return (_randint(self.vocab, (batch_size, self.seq_len), generator, device),
                _randint(self.vocab, (batch_size, self.seq_len), generator, device))

    def loss(self, output, targets):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


# --------------------------------------------------------------------------------------------
# LSTM language model
# --------------------------------------------------------------------------------------------
class _LSTMLayer(nn.Module):
    """One LSTM layer (batch_first) + dropout; returns only the output sequence."""

    def __init__(self, d_in: int, d_hidden: int, dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_in, d_hidden, num_layers=1, batch_first=True)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.drop(out)


class LSTMLM(ZooModel):
    """Word-level LSTM language model standing for Gavel's "LM" job type (PyTorch's
    word_language_model example as Gavel runs it: ``language_modeling/main.py`` defaults
    ``--model LSTM --emsize 200 --nhid 200 --nlayers 2 --dropout 0.2 --bptt 35``, untied weights,
    SGD lr 20 without momentum, gradient clipping at 0.25, on Wikitext-2: 33,278-word vocabulary).

    Each batch starts from a zero hidden state (Gavel carries the detached state across batches;
    the cost is the same).
    Input: int64 token ids ``[B, 35]``; targets: int64 ``[B, 35]`` (next tokens).
    Groups (4): ``embedding`` (Embedding + dropout), ``lstm1``, ``lstm2`` (each LSTM layer +
    dropout, output sequence only), ``decoder`` (Linear 200->33278).
    """

    name = "lstm_lm"
    gavel_job = "LM"
    input_is_index = True
    optimizer_name = "sgd"
    lr = 20.0
    grad_clip = 0.25

    def __init__(self, vocab: int = 33278, emsize: int = 200, nhid: int = 200, bptt: int = 35,
                 dropout: float = 0.2) -> None:
        super().__init__()
        self.vocab, self.bptt = vocab, bptt
        self.add_group("embedding", _Seq(nn.Embedding(vocab, emsize), nn.Dropout(dropout)))
        self.add_group("lstm1", _LSTMLayer(emsize, nhid, dropout))
        self.add_group("lstm2", _LSTMLayer(nhid, nhid, dropout))
        self.add_group("decoder", _Seq(nn.Linear(nhid, vocab)))

    def make_batch(self, batch_size, generator=None, device=None):
        return (_randint(self.vocab, (batch_size, self.bptt), generator, device),
                _randint(self.vocab, (batch_size, self.bptt), generator, device))

    def loss(self, output, targets):
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


# --------------------------------------------------------------------------------------------
# Recommendation
# --------------------------------------------------------------------------------------------
class UserItemEmbedding(nn.Module):
    def __init__(self, users: int, items: int, dim: int) -> None:
        super().__init__()
        self.user = nn.Embedding(users, dim)
        self.item = nn.Embedding(items, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.user(ids[:, 0]), self.item(ids[:, 1])], dim=1)


class Recommendation(ZooModel):
    """Neural collaborative filtering, MLP variant (He et al., WWW 2017), on MovieLens-20M sizes
    (138,493 users, 26,744 items), standing for Gavel's "Recommendation" job type.

    Gavel's job is a different recommender (recoder's ``DynamicAutoencoder`` with one 200-unit
    tanh layer, Adam, on ML-20M); this embedding + MLP model is the analogue whose layers form a
    chain of groups. Its GPU iteration time is anchored to Gavel's throughput.

    Input: int64 ``[B, 2]`` (user id, item id); targets: float ``[B]`` in {0, 1} (implicit
    feedback). Loss: binary cross entropy with logits.
    Groups (5): ``embeddings`` (user and item embeddings, 128 each, concatenated), ``mlp1``
    (256->256 + ReLU), ``mlp2`` (256->128 + ReLU), ``mlp3`` (128->64 + ReLU), ``head`` (64->1).
    Optimizer: Adam (as Gavel's recommendation/train.py).
    """

    name = "recommendation"
    gavel_job = "Recommendation"
    input_is_index = True
    optimizer_name = "adam"
    lr = 1e-3

    def __init__(self, users: int = 138493, items: int = 26744, dim: int = 128,
                 mlp: tuple[int, ...] = (256, 128, 64)) -> None:
        super().__init__()
        self.users, self.items = users, items
        self.add_group("embeddings", UserItemEmbedding(users, items, dim))
        d = 2 * dim
        for i, h in enumerate(mlp, start=1):
            self.add_group(f"mlp{i}", _Seq(nn.Linear(d, h), nn.ReLU()))
            d = h
        self.add_group("head", _Seq(nn.Linear(d, 1), nn.Flatten(0)))

    def make_batch(self, batch_size, generator=None, device=None):
        u = _randint(self.users, (batch_size, 1), generator, None)
        i = _randint(self.items, (batch_size, 1), generator, None)
        y = torch.randint(0, 2, (batch_size,), generator=generator).float()
        x = torch.cat([u, i], dim=1)
        return (x.to(device), y.to(device)) if device else (x, y)

    def loss(self, output, targets):
        return F.binary_cross_entropy_with_logits(output, targets)


# --------------------------------------------------------------------------------------------
# tiny models (tests and the live executor): all take a flattened 8x8 digit, float [B, 64]
# --------------------------------------------------------------------------------------------
class _TinyDigits(ZooModel):
    num_classes = 10

    def make_batch(self, batch_size, generator=None, device=None):
        # like sklearn.datasets.load_digits().data / 16: values in [0, 1]
        x = torch.rand(batch_size, 64, generator=generator)
        y = torch.randint(0, self.num_classes, (batch_size,), generator=generator)
        return (x.to(device), y.to(device)) if device else (x, y)


class _Reshape(nn.Module):
    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.shape)


class TinyCNN(_TinyDigits):
    """Tiny CNN for 8x8 single-channel digits (sklearn ``load_digits``), for tests and the live
    executor. No paper or Gavel job; GPU tables are extrapolated.

    Input: float ``[B, 64]`` (a flattened 8x8 image, reshaped to ``[B, 1, 8, 8]`` inside group 0);
    targets: int64 ``[B]`` in ``0..9``.
    Groups (4): ``conv1`` (1->16, 3x3 + ReLU), ``conv2`` (16->32, 3x3 stride 2 + ReLU -> 4x4),
    ``fc1`` (flatten + 512->64 + ReLU), ``fc2`` (64->10). Optimizer: SGD, momentum 0.9.
    """

    name = "tiny_cnn"
    lr = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.add_group("conv1", _Seq(_Reshape(1, 8, 8), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU()))
        self.add_group("conv2", _Seq(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()))
        self.add_group("fc1", _Seq(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU()))
        self.add_group("fc2", _Seq(nn.Linear(64, 10)))


class TinyMLP(_TinyDigits):
    """Tiny MLP 64 -> 128 -> 64 -> 64 -> 32 -> 10 (ReLU) for sklearn digits, for tests and the
    live executor (the shape of the 6-block loopback case in docs/design.md section 2, with 5
    blocks here).
    No paper or Gavel job; GPU tables are extrapolated.

    Input: float ``[B, 64]``; targets: int64 ``[B]`` in ``0..9``.
    Groups (5): ``fc1 .. fc4`` (Linear + ReLU), ``head`` (Linear 32->10). Optimizer: SGD,
    momentum 0.9.
    """

    name = "tiny_mlp"
    lr = 0.05

    def __init__(self, widths: tuple[int, ...] = (64, 128, 64, 64, 32), num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = num_classes
        for i in range(len(widths) - 1):
            self.add_group(f"fc{i + 1}", _Seq(nn.Linear(widths[i], widths[i + 1]), nn.ReLU()))
        self.add_group("head", _Seq(nn.Linear(widths[-1], num_classes)))


class _RowEmbedding(nn.Module):
    """[B, 64] -> 8 tokens of 8 pixels -> Linear to d_model + learned positions."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.proj = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(8, d_model))
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.reshape(x.shape[0], 8, 8)) + self.pos


class _MeanPoolHead(nn.Module):
    def __init__(self, d_model: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=1))


class TinyTransformer(_TinyDigits):
    """Tiny Transformer encoder for sklearn digits: the 8 image rows are 8 tokens of 8 pixels;
    d_model 32, 4 heads, FFN 64, 2 layers, no dropout. For tests and the live executor; no paper
    or Gavel job; GPU tables are extrapolated.

    Input: float ``[B, 64]``; targets: int64 ``[B]`` in ``0..9``.
    Groups (4): ``embed`` (row projection + positions), ``layer.0``, ``layer.1``, ``head``
    (mean over tokens + Linear 32->10). Optimizer: Adam.
    """

    name = "tiny_transformer"
    optimizer_name = "adam"
    lr = 3e-3

    def __init__(self, d_model: int = 32, layers: int = 2, heads: int = 4, d_ff: int = 64) -> None:
        super().__init__()
        self.add_group("embed", _RowEmbedding(d_model))
        for i in range(layers):
            self.add_group(f"layer.{i}", _EncoderLayer(d_model, heads, d_ff, 0.0, "relu"))
        self.add_group("head", _MeanPoolHead(d_model, 10))


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------
MODELS: dict[str, Callable[..., ZooModel]] = {
    "resnet18": ResNet18Cifar,
    "resnet50": ResNet50,
    "vgg16": VGG16,
    "bert_base": BertBase,
    "transformer_small": TransformerSmall,
    "lstm_lm": LSTMLM,
    "recommendation": Recommendation,
    "tiny_cnn": TinyCNN,
    "tiny_mlp": TinyMLP,
    "tiny_transformer": TinyTransformer,
}


def model_names() -> list[str]:
    return sorted(MODELS)


def build_model(name: str, **kw) -> ZooModel:
    """Build zoo model ``name`` (keyword arguments go to its constructor).

    Raises ValueError naming the allowed models when ``name`` is unknown.
    """
    try:
        ctor = MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; allowed: {model_names()}") from None
    return ctor(**kw)
