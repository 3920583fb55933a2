import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from engine.model.loader import load_tokenizer
from engine.model.tokenizer import BUILTIN_MODEL, Tokenizer, TokenizerNotFoundError

TRAIN_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "train_tokenizer.py"

ROUND_TRIP_TEXTS = [
    "",
    "hello",
    " leading space",
    "   three leading spaces and trailing  ",
    "repeated     spaces\tand\ttabs",
    "line one\nline two\n\n\nafter blank lines\n",
    "\r\nwindows line endings\r\n",
    "    def step(self) -> None:\n        return self.scheduler.schedule()\n",
    '{"name": "click", "arguments": {"element_id": 1432, "text": "Blue \\"M\\""}}',
    "[1432] link 'Blue' focused: True\n\t\t[1433] StaticText '$24.99'",
    "café déjà vu, naïve résumé",
    "中文分词测试，日本語のテキスト，한국어",
    "emoji 🙂👍🏽🎉 and flags 🇫🇷 and ZWJ 👩‍💻",
    "numbers 0 12 345 6789 3.14159 -1e-6 0xdeadbeef 2024-06-01T12:30:45.123Z",
    "sentencepiece meta space \u2581 and \u2581\u2581 stays literal",
    "nul \x00 bell \x07 nbsp \u00a0 zero width \u200b bom \ufeff",
]


@pytest.fixture(scope="module")
def builtin() -> Tokenizer:
    return load_tokenizer(None)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_builtin_round_trips(builtin: Tokenizer, text: str) -> None:
    assert builtin.decode(builtin.encode(text)) == text


def test_builtin_special_ids_and_vocab(builtin: Tokenizer) -> None:
    assert builtin.vocab_size == 4096
    assert (builtin.bos_token_id, builtin.eos_token_id) == (1, 2)


def test_builtin_add_bos_prepends_only_bos(builtin: Tokenizer) -> None:
    plain = builtin.encode("hello world")
    assert builtin.encode("hello world", add_bos=True) == [1, *plain]
    assert 1 not in plain and 2 not in plain
    assert builtin.decode([1, *plain, 2]) == "hello world"


def test_builtin_ids_are_in_vocab(builtin: Tokenizer) -> None:
    ids = builtin.encode("\n".join(ROUND_TRIP_TEXTS))
    assert all(0 <= token_id < builtin.vocab_size for token_id in ids)


def test_builtin_compresses_english(builtin: Tokenizer) -> None:
    text = "Open the settings page, find the API keys section, and create a new key for the agent."
    assert len(builtin.encode(text)) < len(text) / 3


def test_builtin_decodes_every_prefix(builtin: Tokenizer) -> None:
    text = "naïve 中文 🙂 done"
    ids = builtin.encode(text)
    prefixes = [builtin.decode(ids[:end]) for end in range(len(ids) + 1)]
    assert prefixes[-1] == text
    assert all(text.startswith(prefix.rstrip("\ufffd")) for prefix in prefixes)


def test_training_script_reproduces_committed_model() -> None:
    script = _load_script(TRAIN_SCRIPT)
    assert script.train(script.corpus_files()) == BUILTIN_MODEL.read_bytes()


def test_tokenizer_json_checkpoint(tmp_path: Path) -> None:
    _write_hf_tokenizer(tmp_path)
    _write_json(tmp_path / "tokenizer_config.json",
                {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}})
    tokenizer = load_tokenizer(tmp_path)
    reference = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.vocab_size == reference.get_vocab_size()
    assert tokenizer.bos_token_id == reference.token_to_id("<s>")
    assert tokenizer.eos_token_id == reference.token_to_id("</s>")
    ids = tokenizer.encode("the agent clicks the button", add_bos=True)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.eos_token_id is not None
    assert tokenizer.decode([*ids, tokenizer.eos_token_id]) == "the agent clicks the button"


def test_tokenizer_json_special_ids_from_config_json(tmp_path: Path) -> None:
    _write_hf_tokenizer(tmp_path)
    _write_json(tmp_path / "config.json", {"bos_token_id": 1, "eos_token_id": [2, 0]})
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)


def test_tokenizer_json_without_special_tokens(tmp_path: Path) -> None:
    _write_hf_tokenizer(tmp_path)
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (None, None)
    assert tokenizer.encode("agent", add_bos=True) == tokenizer.encode("agent")


def test_tokenizer_json_wins_over_tokenizer_model(tmp_path: Path) -> None:
    _write_hf_tokenizer(tmp_path)
    shutil.copy(BUILTIN_MODEL, tmp_path / "tokenizer.model")
    assert load_tokenizer(tmp_path).vocab_size < 4096


def test_tokenizer_model_checkpoint(tmp_path: Path, builtin: Tokenizer) -> None:
    shutil.copy(BUILTIN_MODEL, tmp_path / "tokenizer.model")
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.vocab_size, tokenizer.bos_token_id, tokenizer.eos_token_id) == (4096, 1, 2)
    text = "  tool result:\n\t{\"ok\": true} ✅"
    assert tokenizer.encode(text) == builtin.encode(text)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_model_special_tokens_from_config(tmp_path: Path) -> None:
    shutil.copy(BUILTIN_MODEL, tmp_path / "tokenizer.model")
    _write_json(tmp_path / "special_tokens_map.json", {"eos_token": "<pad>", "bos_token": "<no-such-token>"})
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 3)


def test_directory_without_tokenizer_raises(tmp_path: Path) -> None:
    _write_json(tmp_path / "config.json", {"bos_token_id": 1})
    with pytest.raises(TokenizerNotFoundError) as raised:
        load_tokenizer(tmp_path)
    assert isinstance(raised.value, ValueError)
    assert str(tmp_path) in str(raised.value)
    assert "\n" not in str(raised.value)


def _write_hf_tokenizer(model_dir: Path) -> None:
    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    lines = ["the agent clicks the button", "the agent reads the page", "a tool returns a result"]
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.save(str(model_dir / "tokenizer.json"))


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lone_surrogates_from_json_become_replacement_marks(builtin: Tokenizer) -> None:
    text = json.loads('"run \\ud83d the tests"')  # a JSON escape of half a surrogate pair: valid JSON, no UTF-8
    assert builtin.encode(text) == builtin.encode("run ? the tests")
