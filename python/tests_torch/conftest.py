import pytest

import fastgen


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
