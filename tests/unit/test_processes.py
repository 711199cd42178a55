"""What the gloo ranks' fork server imports for a model file (``_processes.model_file_modules``):
the model file's libraries as this process loaded them, so eight ranks do not import them again."""

import json  # noqa: F401 - loaded here, as the model file's own import will find it

import transformers

from autoplan._processes import model_file_modules


def test_a_model_files_libraries_and_the_modules_of_the_names_it_imports(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(
        "from __future__ import annotations\n"
        "import json\n"
        "import torch\n"
        "from torch import nn\n"
        "from transformers import GPT2Config\n"
        "from autoplan import LossWithInputs\n"
        "import a_library_nobody_loaded\n"
    )
    transformers.GPT2Config  # noqa: B018 - the model file ran in this process: its lazy names are loaded
    found = model_file_modules(path)
    assert found == ("json", "transformers", "transformers.models.gpt2.configuration_gpt2")


def test_a_file_that_cannot_be_read_preloads_nothing(tmp_path):
    assert model_file_modules(tmp_path / "missing.py") == ()
    (tmp_path / "broken.py").write_text("def (:\n")
    assert model_file_modules(tmp_path / "broken.py") == ()
