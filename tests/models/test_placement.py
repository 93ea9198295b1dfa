"""A model spread over devices (accelerate's device map) decodes exactly what it decodes on one
with the same kernels: here half the layers and the LM head are offloaded to disk, the rest on
the CPU, in float32. (A float32 model whole on a CPU computes on oneDNN's reordered weights,
which a map does not use; the comparison loads it without them.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from llmsample.engine.continuous_batch import BatchItem, decode_batch
from llmsample.engine.loop import generate, run_to_end
from llmsample.engine.prompt import encode_prompt
from llmsample.engine.speculative import ModelDrafter, NgramDrafter
from llmsample.events import RunStats, Summary
from llmsample.models.loading import load_model
from llmsample.models.placement import Placement, parse_max_memory, read_device_map
from llmsample.sampling.config import SamplingConfig
from tests.conftest import load_plain, make_tiny_model

LAYERS = 4
SPLIT = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "cpu",
    "model.layers.2": "disk",
    "model.layers.3": "disk",
    "model.norm": "cpu",
    "lm_head": "disk",
}
SAMPLED = SamplingConfig(temperature=0.9, top_k=20, top_p=0.95, repetition_penalty=1.1, max_tokens=16, seed=11)
PROMPT = "w5 w6 w7 w5 w6 w7 w5 w6"  # repeats, so n-gram drafting proposes something


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("four"), layers=LAYERS, seed=4)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("draft"), layers=1, seed=5)


@pytest.fixture(scope="module")
def whole(four_layer_dir: Path):
    return load_plain(str(four_layer_dir), "cpu", "float32")


@pytest.fixture(scope="module")
def split(four_layer_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("offload")
    return load_model(str(four_layer_dir), placement=Placement(SPLIT, None, str(folder)))


def ids_and_probs(events) -> tuple[list[int], list[float], Summary]:
    tokens, summary = run_to_end(events)
    return [t.token_id for t in tokens], [t.prob for t in tokens], summary


def test_the_split_model_really_is_split(split) -> None:
    assert split.placed_on == ("cpu", "disk")
    assert split.device == split.sample_device == torch.device("cpu")
    offloaded = split.model.model.layers[3].self_attn.q_proj.weight
    assert offloaded.device.type == "meta"  # its weights are read when the layer runs


@pytest.mark.parametrize("cfg", [SAMPLED, SamplingConfig(temperature=0, max_tokens=16, seed=0)])
def test_generate_gives_the_single_device_tokens(whole, split, cfg: SamplingConfig) -> None:
    runs = []
    for lm in (whole, split):
        ids = encode_prompt(lm, PROMPT, raw=True)
        runs.append(ids_and_probs(generate(lm, ids, cfg, RunStats("m", "p", cfg.seed), ignore_eos=True)))
    (whole_ids, whole_probs, _), (split_ids, split_probs, _) = runs
    assert split_ids == whole_ids and len(whole_ids) == cfg.max_tokens
    assert split_probs == whole_probs


def test_the_kv_cache_fills_on_each_layers_device(split) -> None:
    from llmsample.engine.runner import ModelRunner

    with ModelRunner.for_run(split, 1, 32) as runner:
        runner.prefill(encode_prompt(split, PROMPT, raw=True))
        devices = {layer.keys.device.type for layer in runner.cache.layers}
    assert devices == {"cpu"}  # disk layers execute on the CPU here; on GPUs, one device per layer


def test_speculation_with_ngrams_gives_the_single_device_tokens(whole, split) -> None:
    runs = []
    for lm in (whole, split):
        ids = encode_prompt(lm, PROMPT, raw=True)
        drafter = NgramDrafter(lm.model.config.vocab_size, lm.sample_device)
        stats = RunStats("m", "p", SAMPLED.seed)
        runs.append(ids_and_probs(generate(lm, ids, SAMPLED, stats, drafter=drafter, ignore_eos=True)))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert runs[1][2].facts.speculation.drafted > 0


def test_speculation_with_a_draft_model_gives_the_single_device_tokens(whole, split, draft_dir: Path) -> None:
    draft = load_model(str(draft_dir), "cpu", "float32")
    runs = []
    for lm in (whole, split):
        ids = encode_prompt(lm, PROMPT, raw=True)
        drafter = ModelDrafter(draft, lm.model.config.vocab_size, lm.sample_device)
        stats = RunStats("m", "p", SAMPLED.seed)
        runs.append(ids_and_probs(generate(lm, ids, SAMPLED, stats, drafter=drafter, ignore_eos=True)))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert runs[1][2].facts.speculation.drafted > 0


def test_batch_decoding_gives_the_single_device_records(whole, split) -> None:
    prompts = ["w5 w6", "w9 w10 w11 w12 w13", "w20", "w7 w7 w7"]
    records = []
    for lm in (whole, split):
        items = [
            BatchItem(
                key=i,
                prompt_ids=lm.tokenizer(p, add_special_tokens=False)["input_ids"],
                cfg=SamplingConfig(temperature=0.8, top_p=0.9, max_tokens=6 + 2 * i, seed=100 + i),
                stats=RunStats("m", "p", 100 + i),
            )
            for i, p in enumerate(prompts)
        ]
        got: dict[int, list[tuple[int, float]]] = {}
        for key, item in decode_batch(lm, items, batch_size=2, ignore_eos=True):
            if hasattr(item, "token_id"):
                got.setdefault(key, []).append((item.token_id, item.prob))
        records.append(got)
    # The same tokens; a padded prefill's probabilities may differ in the last float32 bits (the
    # offloaded LM head gets its strided input in another memory layout).
    for key, whole_rows in records[0].items():
        assert [t for t, _ in records[1][key]] == [t for t, _ in whole_rows]
        assert [p for _, p in records[1][key]] == pytest.approx([p for _, p in whole_rows], rel=1e-5)
    assert sorted(len(v) for v in records[1].values()) == [6, 8, 10, 12]


def test_max_memory_syntax() -> None:
    # bytes, the one form accelerate reads for every size (it refuses "300000" and reads "kb" as kilobits)
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=60GiB") == {0: 20 * 2**30, 1: 20 * 2**30, "cpu": 60 * 2**30}
    assert parse_max_memory("cpu=1.5GB") == {"cpu": 1_500_000_000}
    assert parse_max_memory("cpu=300000") == {"cpu": 300_000}
    assert parse_max_memory("cpu=4000000000") == {"cpu": 4_000_000_000}
    assert parse_max_memory("cpu=60kb,mps=2 tib") == {"cpu": 60_000, "mps": 2 * 2**40}
    for bad, fragment in [
        ("0:20GiB", "is not DEVICE=SIZE"),
        ("cpu=", "is not DEVICE=SIZE"),
        ("gpu0=20GiB", "is not a GPU index"),
        ("disk=1GiB", "is not a GPU index"),
        ("cpu=lots", "is not a size"),
        ("cpu=1GiB,cpu=2GiB", "given twice"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            parse_max_memory(bad)


def test_device_map_names_and_files(tmp_path: Path) -> None:
    assert read_device_map("balanced") == "balanced"
    path = tmp_path / "map.json"
    path.write_text(json.dumps(SPLIT))
    assert read_device_map(str(path)) == SPLIT
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        read_device_map(str(path))
    with pytest.raises(ValueError, match="neither auto"):
        read_device_map("everywhere")
    # issue 25, 9: devices are checked by name (torch would fail deep in the load on "gpu7")
    for device in ("gpu7", "cuda:x", "cuda0", -1, True, None, 1.5):
        path.write_text(json.dumps({**SPLIT, "model.layers.0": device}))
        with pytest.raises(ValueError, match=r"'model\.layers\.0' maps to .*, which is no device; use a GPU index"):
            read_device_map(str(path))
    path.write_text(json.dumps({**SPLIT, "model.layers.0": "1", "model.layers.1": "cuda:2", "lm_head": "mps"}))
    assert read_device_map(str(path)) == {**SPLIT, "model.layers.0": 1, "model.layers.1": "cuda:2", "lm_head": "mps"}


@pytest.fixture(scope="module")
def skeleton(four_layer_dir: Path):
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(four_layer_dir))


def test_an_explicit_map_covers_the_model_and_names_only_its_modules(skeleton) -> None:
    """Issue 25, 11: accelerate's rules, before the load (transformers put what a map left out on
    the CPU, and ignored an entry naming nothing)."""
    from llmsample.errors import UserError
    from llmsample.models.placement import check_map_covers

    for good in (SPLIT, {"": "cpu"}, {"model": "cpu", "lm_head": "disk"}, {**SPLIT, "lm_head.weight": "cpu"}):
        check_map_covers(skeleton, good, "m")
    without_norm = {k: v for k, v in SPLIT.items() if k != "model.norm"}
    with pytest.raises(UserError, match=r"^--device-map gives no device to 'model\.norm' of model 'm'; map every"):
        check_map_covers(skeleton, without_norm, "m")
    with pytest.raises(UserError, match=r"no device to 'model\.layers\.2\.self_attn\.q_proj', .* and \d+ more"):
        check_map_covers(skeleton, {k: v for k, v in SPLIT.items() if k != "model.layers.2"}, "m")
    with pytest.raises(UserError, match=r"names 'model\.layers\.7', which model 'm' does not have \(model\.layers "
                       r"holds model\.layers\.0 to model\.layers\.3\)"):  # fmt: skip
        check_map_covers(skeleton, {**SPLIT, "model.layers.7": "cpu"}, "m")
    with pytest.raises(UserError, match=r"names 'modle', which model 'm' does not have \(it holds model, lm_head\)"):
        check_map_covers(skeleton, {**SPLIT, "modle": "cpu"}, "m")
