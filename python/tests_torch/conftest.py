import os

import pytest
import torch

import fastgen
import fastgen.transformers as fgt


@pytest.fixture(scope="session")
def model_path():
    """SmolLM2-135M-Instruct (scripts/get-models.sh caches it; .ci/run fetches it first), or $FASTGEN_MODEL.
    Missing, the tests fail and say how to get it: they do not skip."""
    try:
        return fastgen.find_model()
    except FileNotFoundError as e:
        pytest.fail(f"{e} (bash scripts/get-models.sh)")


@pytest.fixture(scope="session")
def model(model_path):
    """fastgen's runner for the tokenizer (the same ids in both runners)."""
    m = fastgen.Model(model_path)
    yield m
    m.close()


@pytest.fixture(scope="session")
def hf(model_path):
    """(model, tokenizer): SmolLM2 loaded once by transformers from our GGUF file (fp32), for every test module;
    the tests leave it as they found it when they pass (fgt.disable in a finally, the press's context)."""
    torch.set_num_threads(int(os.environ.get("FASTGEN_THREADS", "0")) or torch.get_num_threads())
    return fgt.from_gguf(model_path)
