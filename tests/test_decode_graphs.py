"""autoopt.nn.decode_graphs: generate()'s compiled decode step replayed from one captured graph per signature.

On the CPU a CUDA graph cannot be captured, so these tests hand :func:`install` a stand-in capture whose replay
runs the step again on the captured static inputs and writes into the captured outputs, as a graph does; every
other part (transformers' own ``generate()`` with a real ``StaticCache``, the signatures, the copies into the
static inputs, the warm-up's counter restore, the fallbacks) is the code that runs on a GPU. The GPU run is
``benchmarks/probes/generate_host.py``.
"""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autoopt.nn import decode_graphs  # noqa: E402
from autoopt.nn.decode_graphs import DecodeGraphs, install, installed, uninstall  # noqa: E402

PROMPT, NEW = 6, 9


class Rerun:
    """A stand-in for :func:`decode_graphs.cuda_capture`: replay re-runs the step and copies its outputs into
    the ones the capture returned (a CUDA graph writes the same buffers every replay)."""

    def __init__(self) -> None:
        self.captures = 0
        self.replays = 0

    def __call__(self, run):
        self.captures += 1
        output = run()

        def replay() -> None:
            self.replays += 1
            fresh = run()
            for key, value in output.items():
                if isinstance(value, torch.Tensor):
                    value.copy_(fresh[key])
        return replay, output


@pytest.fixture
def model():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _compile_here():
    config = transformers.CompileConfig()
    config._compile_all_devices = True  # transformers compiles only on accelerators unless told
    return config


def _generate(model, cache=None, batch=1, compiled=True, new=NEW):
    ids = torch.arange(batch * PROMPT).reshape(batch, PROMPT) % 100 + 3
    cache = cache or transformers.StaticCache(config=model.config, max_cache_len=PROMPT + new)
    with torch.inference_mode():
        return model.generate(ids, past_key_values=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              pad_token_id=0, compile_config=_compile_here() if compiled else None,
                              disable_compile=not compiled)


def test_generate_replays_one_captured_step_per_signature(model):
    rerun = Rerun()
    assert install(model, capture=rerun, compile=lambda config: lambda fn: fn)
    _generate(model)
    (runner,) = installed(model)
    assert (rerun.captures, rerun.replays, len(runner.graphs)) == (1, NEW - 1, 1)


def test_replayed_generation_gives_the_tokens_of_the_eager_one(model):
    eager = _generate(model, compiled=False)
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    assert torch.equal(_generate(model), eager)


def test_warm_up_leaves_the_cache_counters_where_the_caller_left_them(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    _generate(model, cache=cache)
    # prefill wrote PROMPT positions, each of the NEW - 1 decode steps one: no warm-up run counted
    assert [int(layer.cumulative_length) for layer in cache.layers] == [PROMPT + NEW - 1] * 2


def test_a_new_batch_size_is_a_new_signature(model):
    rerun = Rerun()
    install(model, capture=rerun, compile=lambda config: lambda fn: fn)
    _generate(model, batch=1)
    _generate(model, batch=2)
    assert len(installed(model)[0].graphs) == 2 and rerun.captures == 2


def test_a_new_cache_object_is_captured_again_not_replayed_into_the_old_one(model):
    rerun = Rerun()
    install(model, capture=rerun, compile=lambda config: lambda fn: fn)
    _generate(model)
    _generate(model)  # a fresh StaticCache: other buffers
    assert rerun.captures == 2


def test_the_same_cache_reset_between_generations_replays_the_same_graph(model):
    rerun = Rerun()
    install(model, capture=rerun, compile=lambda config: lambda fn: fn)
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    first = _generate(model, cache=cache)
    with torch.inference_mode():  # the cache's tensors were made in inference mode
        cache.reset()
    second = _generate(model, cache=cache)
    assert rerun.captures == 1 and torch.equal(first, second)


def test_a_cache_whose_buffer_was_reassigned_is_captured_again(model):
    # transformers reassigns a layer's buffers on a beam reorder or an offload: the old graph writes the old ones
    rerun = Rerun()
    install(model, capture=rerun, compile=lambda config: lambda fn: fn)
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    first = _generate(model, cache=cache)
    with torch.inference_mode():
        cache.reset()
        cache.layers[1].keys = cache.layers[1].keys.clone()
    second = _generate(model, cache=cache)
    assert rerun.captures == 2 and torch.equal(first, second)


def test_a_caches_key_is_derived_once_and_kept_while_its_buffers_stay(model):
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    _generate(model, cache=cache, compiled=False)
    key = decode_graphs._cache_key(cache)
    assert decode_graphs._cache_key(cache) is key
    with torch.inference_mode():
        cache.layers[0].cumulative_length = cache.layers[0].cumulative_length.clone()
    assert decode_graphs._cache_key(cache) != key


def test_the_kept_key_does_not_keep_a_cache_alive(model):
    import gc
    import weakref

    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    _generate(model, cache=cache, compiled=False)
    decode_graphs._cache_key(cache)
    gone = weakref.ref(cache)
    del cache
    gc.collect()
    assert gone() is None


def test_a_step_beyond_max_graphs_runs_transformers_compiled_call(model):
    calls = []
    runner = DecodeGraphs(model, lambda: lambda **kw: calls.append(kw) or "fallback",
                          compile=lambda fn: fn, capture=Rerun(), max_graphs=0)
    assert runner(input_ids=torch.ones(1, 1, dtype=torch.long)) == "fallback"
    assert list(runner.refused) == ["more than 0 signatures (MAX_GRAPHS)"] and len(calls) == 1


def test_an_argument_of_an_unknown_type_runs_transformers_compiled_call(model):
    runner = DecodeGraphs(model, lambda: lambda **kw: "fallback", compile=lambda fn: fn, capture=Rerun())
    assert runner(input_ids=torch.ones(1, 1, dtype=torch.long), extra=object()) == "fallback"
    assert list(runner.refused) == ["argument 'extra' of type object"]


def test_positional_arguments_run_transformers_compiled_call(model):
    runner = DecodeGraphs(model, lambda: lambda *a, **kw: "fallback", compile=lambda fn: fn, capture=Rerun())
    assert runner(torch.ones(1, 1, dtype=torch.long)) == "fallback"
    assert list(runner.refused) == ["positional arguments"]


def test_hidden_states_kept_per_step_are_not_overwritten_by_a_replay(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    ids = torch.arange(PROMPT)[None] + 3
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         pad_token_id=0, compile_config=_compile_here(), output_hidden_states=True,
                         return_dict_in_generate=True)
    last = [step[-1] for step in out.hidden_states[1:]]  # each decode step's final hidden state
    assert not any(torch.equal(a, b) for a, b in itertools.pairwise(last))
    assert list(installed(model)[0].refused) == ["output_hidden_states=True"]


def test_generate_outside_inference_mode_replays_too(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    ids = torch.arange(PROMPT)[None] + 3
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    out = model.generate(ids, past_key_values=cache, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                         pad_token_id=0, compile_config=_compile_here())
    assert torch.equal(out, _generate(model, compiled=False)) and len(installed(model)[0].graphs) == 1


def test_a_capture_that_fails_runs_transformers_compiled_call_and_says_why(model):
    attempts = []

    def broken(run):
        attempts.append(1)
        raise RuntimeError("operation not permitted when stream is capturing")

    install(model, capture=broken, compile=lambda config: lambda fn: fn)
    eager = _generate(model, compiled=False)
    assert torch.equal(_generate(model), eager)
    (runner,) = installed(model)
    why = "capture failed: RuntimeError: operation not permitted when stream is capturing"
    assert runner.graphs == {} and runner.refused == {why: NEW - 1}
    assert len(attempts) == 1  # not tried again at every step of the same signature


def test_a_sliding_window_cache_is_not_captured(model):
    runner = DecodeGraphs(model, lambda: lambda **kw: "fallback", compile=lambda fn: fn, capture=Rerun())
    layer = transformers.cache_utils.StaticSlidingWindowLayer(max_cache_len=8, sliding_window=4)
    layer.is_initialized = True
    cache = type("Cache", (), {"is_compileable": True, "layers": [layer]})()
    assert runner(past_key_values=cache) == "fallback"
    assert list(runner.refused) == ["a cache layer of type StaticSlidingWindowLayer (only full-attention StaticLayer)"]


def test_a_compile_backend_other_than_inductor_keeps_transformers_own_call(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    config = transformers.CompileConfig(backend="eager")
    assert not isinstance(model.get_compiled_call(config), DecodeGraphs)


def test_uninstall_gives_back_transformers_call_and_drops_the_graphs(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    _generate(model)
    assert uninstall(model) and installed(model) == []
    assert "get_compiled_call" not in model.__dict__


def test_install_refuses_a_module_that_is_not_a_transformers_model():
    assert install(torch.nn.Linear(2, 2)) is False


def test_optimize_installs_nothing_on_the_cpu(model):
    import autoopt

    report = autoopt.optimize(model, check=False)
    assert installed(model) == [] and not any("decode step" in n for n in report.notes)


def test_optimize_takes_decode_graphs_as_a_bool(model):
    import autoopt

    with pytest.raises(TypeError, match="decode_graphs= take a bool"):
        autoopt.optimize(model, decode_graphs="yes")


def test_max_graphs_is_one_per_batch_size_a_server_decodes_at():
    assert decode_graphs.MAX_GRAPHS == 8


def test_an_optimized_moe_model_replays_its_decode_step_with_the_tokens_of_eager():
    import autoopt
    from autoopt.nn.match import OPS

    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                        max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    moe = transformers.MixtralForCausalLM(config).eval()
    autoopt.optimize(moe, ops=OPS, check=False)
    eager = _generate(moe, compiled=False)
    install(moe, capture=Rerun(), compile=lambda config: lambda fn: fn)
    assert torch.equal(_generate(moe), eager)
    assert len(installed(moe)[0].graphs) == 1 and installed(moe)[0].refused == {}


def test_a_left_padded_batch_gives_eager_tokens_with_the_mask_built_inside_the_step(model):
    ids = torch.arange(2 * PROMPT).reshape(2, PROMPT) % 100 + 3
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # the first prompt is two tokens shorter, padded on the left
    ids[0, :2] = 0

    def generate(compiled):
        cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=NEW,
                                  min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                                  compile_config=_compile_here() if compiled else None, disable_compile=not compiled)

    eager = generate(compiled=False)  # transformers' 4D masks, built on the host every step
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    assert torch.equal(generate(compiled=True), eager) and len(installed(model)[0].graphs) == 1


def test_the_mask_a_decode_step_gets_is_the_padding_mask_at_the_cache_length(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    cache = transformers.StaticCache(config=model.config, max_cache_len=PROMPT + NEW)
    _generate(model, cache=cache)
    mask = model.create_masks_for_generate(config=model.config, inputs_embeds=torch.empty(1, 1, 0),
                                           attention_mask=torch.ones(1, PROMPT + 1, dtype=torch.long),
                                           past_key_values=cache, position_ids=None)
    assert mask.tolist() == [[1] * (PROMPT + 1) + [0] * (NEW - 1)]


def test_uninstall_gives_back_transformers_masks(model):
    install(model, capture=Rerun(), compile=lambda config: lambda fn: fn)
    uninstall(model)
    assert "create_masks_for_generate" not in model.__dict__


def test_an_unhashable_argument_with_layers_is_not_taken_for_a_kept_cache():
    class Layered:
        layers = (1, 2)
        __hash__ = None  # type: ignore[assignment]

    assert decode_graphs._seen(Layered()) is False
    with pytest.raises(decode_graphs.Uncapturable, match="argument 'past_key_values' of type Layered"):
        decode_graphs._Signature({"past_key_values": Layered()}, (False, True))
