"""The models evenflow builds by name, as the run sees them: names and the inputs each can take.

Every framework adapter builds the same names (``mlp`` for any input, ``cnn`` for images,
``text_cnn`` for token sequences, ``hashed_text`` for token sequences on parameter servers) or
refuses one it does not have. The checks are pure
Python, so a run fails on a wrong model before a framework starts.
"""
from __future__ import annotations

from evenflow.run.options import MODEL_NAMES
from evenflow.util.validate import check_choice

_NEEDS = {"cnn": (2, 3), "text_cnn": (1,), "hashed_text": (1,)}
_TEXT = ("text_cnn", "hashed_text")  # models of token sequences  # accepted ranks of one sample's features; absent = any rank
EMBED_SIZE = 32  # text_cnn's embedding width
# The most rows text_cnn's embedding may have: 2^20 x 32 float32 = 128 MiB, held once per replica, and
# twice more by Adam's moments.
MAX_VOCAB = 1 << 20


def check_model_input(name: str, input_shape: tuple[int, ...]) -> None:
    """Raise ``ValueError`` if model ``name`` is unknown or cannot take ``input_shape``.

    Pure Python, so it can run before a framework starts.
    """
    check_choice("model", name, MODEL_NAMES)
    if name in _TEXT and len(input_shape) != 1:
        raise ValueError(f"model {name!r} needs token sequences (per-sample shape (length,)), got "
                         f"{tuple(input_shape)}; use it with a text dataset such as builtin:stdlib-docs")
    if name not in _TEXT and None in tuple(input_shape):
        raise ValueError(f"model {name!r} needs fixed-size features, but this dataset's sequences vary in length "
                         f"(per-sample shape {tuple(input_shape)}); use model 'text_cnn'")
    ranks = _NEEDS.get(name)
    if ranks and len(input_shape) not in ranks:
        raise ValueError(
            f"model {name!r} needs image-shaped features [H, W] or [H, W, C], got per-sample shape "
            f"{tuple(input_shape)}; reshape the features or use model 'mlp'")


def check_tokens(name: str, data) -> None:
    """Raise ``ValueError`` if model ``name`` embeds token ids and ``data`` cannot feed it.

    ``text_cnn`` embeds integer ids: a variable-length float32 list is refused, and so are
    fixed-size features (it would read them as byte ids) and a vocabulary (``data.vocab_size``)
    whose embedding would exceed :data:`MAX_VOCAB` rows. Pure Python, so it can run before a
    framework starts.
    """
    if name not in _TEXT:
        return
    records = getattr(data, "records", None)
    spec = getattr(records, "feature_spec", None)
    if spec is not None and spec.varlen and spec.dtype != "int64":
        raise ValueError(f"model {name!r} embeds integer token ids, but feature {records.feature_key!r} is a "
                         f"variable-length {spec.dtype} list; store token ids as an int64 list, or train on these "
                         f"values with a model of your own through evenflow's API")
    vocab = getattr(data, "vocab_size", None)
    if vocab is None and None not in tuple(data.feature_shape):
        what, fix = f"its features have the fixed shape {tuple(data.feature_shape)}", "use another --model"
        if spec is not None:
            what = f"feature {records.feature_key!r} holds {spec.size} values in every record (a fixed-size feature)"
            fix += (f", or train {name} through evenflow's API on the feature declared variable-length "
                    "(FeatureSpec('int64', (None,)))")
        raise ValueError(f"model {name!r} embeds token ids (text, or an int64 list whose length varies from "
                         f"record to record), but {what}, which it would read as byte ids; {fix}")
    if name == "text_cnn" and vocab is not None and vocab > MAX_VOCAB:  # hashed_text hashes any id
        mib = vocab * EMBED_SIZE * 4 / 2 ** 20
        raise ValueError(f"model 'text_cnn' would need an embedding of {vocab:,} rows (token ids up to "
                         f"{vocab - 2:,}, read as id + 1) x {EMBED_SIZE} floats = {mib:,.0f} MiB per replica, 3x that "
                         f"with Adam's state; evenflow builds at most {MAX_VOCAB:,} rows: map the ids to a dense "
                         f"vocabulary 0..{MAX_VOCAB - 2:,} when writing the records")
