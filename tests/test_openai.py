"""OpenAI's API under /v1 (/v1/models, /v1/completions, /v1/chat/completions), read by the
`openai` SDK (sync and async) and by raw sockets (the SSE framing byte for byte), over the toy
model of examples/models (a Triton Python model with the vLLM backend's interface) and
in-memory generators whose observations prove cancellation and back-pressure."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import os
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import openinfer
from openinfer import Model, Tensor

from conftest import Observed

openai = pytest.importorskip("openai")

BOUND = 30.0
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "models" / "toy_llm"
# The toy's chat template, rendered for one user message "hi".
HI_PROMPT = "<|user|>hi</s>\n<|assistant|>"

gated = Observed()
flood = Observed()
lengthy = Observed()


def _text(inputs: dict[str, np.ndarray]) -> str:
    return inputs["text_input"].reshape(-1)[0].decode()


def _gated(inputs: dict[str, np.ndarray], request: openinfer.Request) -> Iterator[dict[str, np.ndarray]]:
    """One token, then nothing until the test opens the gate or the client goes."""
    try:
        gated.note(produced=1)
        yield {"text_output": np.array([b"a"], dtype=np.object_)}
        deadline = time.monotonic() + BOUND
        while not gated.gate.wait(0.005) and not request.is_cancelled():
            assert time.monotonic() < deadline, "the test never opened the gate"
        gated.note(produced=2, cancelled=request.is_cancelled())
        yield {"text_output": np.array([b"b"], dtype=np.object_)}
        gated.note(finished=True)
    except GeneratorExit:
        gated.note(closed=True)
        raise


def _flood(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """64 KiB tokens as fast as it may, up to 20000: only back-pressure bounds the memory."""
    block = np.array([b"x" * 65536], dtype=np.object_)
    try:
        for i in range(20_000):
            flood.note(produced=i + 1)
            yield {"text_output": block}
        flood.note(finished=True)
    except GeneratorExit:
        flood.note(closed=True)
        raise


def _halfway(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """One token, then a failure."""
    yield {"text_output": np.array([b"a"], dtype=np.object_)}
    raise ValueError("the model broke half way")


def _echo(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A plain text model (no sampling parameters, no counts): the prompt reversed."""
    return {"text_output": np.array([_text(inputs)[::-1].encode()], dtype=np.object_)}


def _vectors(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), sum(t.encode()) / 1000, 0.5, -1.25] for t in texts], dtype=np.float32)


def _embed(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Four numbers per string, and the strings' byte count as the tokens read."""
    texts = [t.decode() for t in inputs["text_input"].reshape(-1)]
    return {"embedding": _vectors(texts), "num_input_tokens": np.array([sum(len(t.encode()) for t in texts)],
                                                                       dtype=np.uint32)}


def _text_io() -> dict[str, list[Tensor]]:
    return {"inputs": [Tensor("text_input", "BYTES", [1])], "outputs": [Tensor("text_output", "BYTES", [1])]}


# What _bad_logprobs gives as its second token's logprobs, by prompt.
BAD_LOGPROBS = {
    "null": b"null",
    "malformed": b'[{"1": {"logprob": -1',
    "nan": b'[{"1": {"logprob": NaN, "rank": 1, "decoded_token": "b"}}]',
    "no_logprob": b'[{"1": {"rank": 1, "decoded_token": "b"}}]',
    "not_a_list": b'{"1": {"logprob": -1}}',
    "empty_token": b'[{}]',
}


def _bad_logprobs(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """A good first token, then the second's logprobs as the prompt names in BAD_LOGPROBS."""
    good = b'[{"1": {"logprob": -0.5, "rank": 1, "decoded_token": "a"}}]'
    yield {"text_output": np.array([b"a"], dtype=np.object_), "logprobs": np.array([good], dtype=np.object_)}
    yield {"text_output": np.array([b"b"], dtype=np.object_),
           "logprobs": np.array([BAD_LOGPROBS[_text(inputs)]], dtype=np.object_)}


def _long_tokens(inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    """One-byte tokens whose decoded text in the logprobs is 60000 bytes, up to 2000 of them."""
    lp = json.dumps([{"1": {"logprob": -0.5, "rank": 1, "decoded_token": "x" * 60000}}]).encode()
    for i in range(2000):
        lengthy.note(produced=i + 1)
        yield {"text_output": np.array([b"x"], dtype=np.object_), "logprobs": np.array([lp], dtype=np.object_)}


def _logprobs_io() -> dict[str, list[Tensor]]:
    return {"inputs": [Tensor("text_input", "BYTES", [1]), Tensor("sampling_parameters", "BYTES", [1]),
                       Tensor("return_logprobs", "BOOL", [1])],
            "outputs": [Tensor("text_output", "BYTES", [1]), Tensor("logprobs", "BYTES", [1])]}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openinfer.Server]:
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(EXAMPLE, repo / "toy_llm")
    models = [
        Model("gated_text", _gated, **_text_io()),
        Model("flood_text", _flood, **_text_io()),
        Model("echo_text", _echo, **_text_io()),
        Model("halfway_text", _halfway, **_text_io()),
        Model("bad_logprobs", _bad_logprobs, **_logprobs_io()),
        Model("long_logprobs", _long_tokens, **_logprobs_io()),
        Model("embedder", _embed, inputs=[Tensor("text_input", "BYTES", [-1])],
              outputs=[Tensor("embedding", "FP32", [-1, 4]), Tensor("num_input_tokens", "UINT32", [1])]),
        Model("not_text", _echo, inputs=[Tensor("INPUT0", "BYTES", [1])], outputs=[Tensor("OUTPUT0", "BYTES", [1])]),
    ]
    srv = openinfer.serve(repo, models=models, http_port=0, log=False, threads=2)
    try:
        yield srv
    finally:
        gated.gate.set()
        srv.stop()


@pytest.fixture()
def client(served: openinfer.Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=BOUND, max_retries=0) as c:
        yield c


def chat(client: openai.OpenAI, content: str = "hi", **kw: object) -> object:
    return client.chat.completions.create(model="toy_llm", messages=[{"role": "user", "content": content}], **kw)


# ---- models ------------------------------------------------------------------------------------


def test_models_lists_the_text_models(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    assert set(models) == {"toy_llm", "gated_text", "flood_text", "echo_text", "embedder",
                           "halfway_text", "bad_logprobs", "long_logprobs"}  # not not_text
    assert models["toy_llm"].owned_by == "openinfer" and models["toy_llm"].created > 1_700_000_000
    assert client.models.retrieve("toy_llm").id == "toy_llm"


@pytest.mark.parametrize("name", ["nope", "not_text"])
def test_an_unknown_model_is_404_model_not_found(client: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve(name)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model=name, prompt="x")
    assert err.value.body == {"message": f"The model `{name}` does not exist.", "type": "invalid_request_error",
                              "param": "model", "code": "model_not_found"}


# ---- completions -------------------------------------------------------------------------------


def test_completion_counts_tokens_and_ends_at_max_tokens(client: openai.OpenAI) -> None:
    done = client.completions.create(model="toy_llm", prompt="hello", max_tokens=8)
    assert done.object == "text_completion" and done.id.startswith("cmpl-")
    choice = done.choices[0]
    assert len(choice.text.encode()) == 8 and choice.finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (5, 8, 13)
    # Deterministic (temperature 0 by default): the same prompt, the same text.
    assert client.completions.create(model="toy_llm", prompt="hello", max_tokens=8).choices[0].text == choice.text


def test_echo_puts_the_prompt_before_the_completion(client: openai.OpenAI) -> None:
    plain = client.completions.create(model="toy_llm", prompt="hello", max_tokens=4).choices[0].text
    echoed = client.completions.create(model="toy_llm", prompt="hello", max_tokens=4, echo=True).choices[0].text
    assert echoed == "hello" + plain


def test_stop_sequences_end_the_text_before_them(client: openai.OpenAI) -> None:
    full = client.completions.create(model="toy_llm", prompt="hello", max_tokens=40).choices[0].text
    stop = full[10:13]
    done = client.completions.create(model="toy_llm", prompt="hello", max_tokens=40, stop=[stop])
    assert done.choices[0].text == full[: full.index(stop)] and done.choices[0].finish_reason == "stop"


def test_seed_makes_a_sampled_completion_repeat(client: openai.OpenAI) -> None:
    texts = {client.completions.create(model="toy_llm", prompt="p", max_tokens=12, temperature=1.0,
                                       seed=7).choices[0].text for _ in range(3)}
    assert len(texts) == 1


# ---- chat --------------------------------------------------------------------------------------


def test_chat_renders_the_template_and_counts_its_tokens(client: openai.OpenAI) -> None:
    done = chat(client)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    message = done.choices[0].message
    assert message.role == "assistant" and message.content
    assert done.usage.prompt_tokens == len(HI_PROMPT.encode())
    assert done.usage.completion_tokens == len(message.content.encode())


def test_max_completion_tokens_wins_over_max_tokens(client: openai.OpenAI) -> None:
    done = chat(client, "a long question", max_completion_tokens=3, max_tokens=9)
    assert done.usage.completion_tokens == 3 and done.choices[0].finish_reason == "length"


def test_streamed_chat_is_the_same_text_in_chunks_with_usage_last(client: openai.OpenAI) -> None:
    whole = chat(client, "stream me", max_tokens=10)
    chunks = list(chat(client, "stream me", max_tokens=10, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1 and chunks[0].object == "chat.completion.chunk"


def test_async_client_streams_a_completion(served: openinfer.Server) -> None:
    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="x", timeout=BOUND) as c:
            whole = await c.completions.create(model="toy_llm", prompt="async", max_tokens=6)
            stream = await c.completions.create(model="toy_llm", prompt="async", max_tokens=6, stream=True)
            return whole.choices[0].text, "".join([chunk.choices[0].text async for chunk in stream])

    whole, streamed = asyncio.run(run())
    assert streamed == whole and len(whole) == 6


def test_a_model_without_a_template_serves_completions_only(client: openai.OpenAI) -> None:
    assert client.completions.create(model="echo_text", prompt="abc").choices[0].text == "cba"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="echo_text", messages=[{"role": "user", "content": "x"}])
    assert "has no folder with a chat template" in err.value.body["message"]


# ---- log probabilities ---------------------------------------------------------------------------

LN2 = 0.6931471805599453  # the toy gives its token probability 1/2, the next candidates 1/4, 1/8, ...


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("top", [0, 3])
def test_chat_logprobs_give_each_tokens_and_its_likeliest(client: openai.OpenAI, top: int, stream: bool) -> None:
    kw: dict[str, object] = {"max_tokens": 6, "logprobs": True, **({"top_logprobs": top} if top else {})}
    if stream:
        chunks = [c.choices[0] for c in chat(client, "tell", stream=True, **kw)]
        text = "".join(c.delta.content or "" for c in chunks)
        for c in chunks:  # each chunk carries the tokens of its text
            assert "".join(t.token for t in (c.logprobs.content if c.logprobs else [])) == (c.delta.content or "")
        content = [t for c in chunks if c.logprobs for t in c.logprobs.content]
    else:
        done = chat(client, "tell", **kw).choices[0]
        text, content = done.message.content, done.logprobs.content
    assert "".join(t.token for t in content) == text and len(content) == 6
    for t in content:
        assert t.logprob == pytest.approx(-LN2) and t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == top
        assert [c.logprob for c in t.top_logprobs] == pytest.approx([-LN2 * r for r in range(1, top + 1)])
        if top:  # the sampled token is the likeliest
            assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)
            assert len({c.token for c in t.top_logprobs}) == top


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("k", [0, 3])
def test_completion_logprobs_in_openais_legacy_shape(client: openai.OpenAI, k: int, stream: bool) -> None:
    kw: dict[str, object] = {"model": "toy_llm", "prompt": "hello", "max_tokens": 5, "logprobs": k}
    if stream:
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
        text = "".join(c.text for c in chunks)
        parts = [c.logprobs for c in chunks if c.logprobs]
        tokens = [t for p in parts for t in p.tokens]
        values = [v for p in parts for v in p.token_logprobs]
        tops = [d for p in parts for d in p.top_logprobs]
        offsets = [o for p in parts for o in p.text_offset]
    else:
        done = client.completions.create(**kw).choices[0]
        text, lp = done.text, done.logprobs
        tokens, values, tops, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    assert "".join(tokens) == text and len(tokens) == 5
    assert offsets == [len("".join(tokens[:i])) for i in range(5)]  # across chunks too
    assert values == pytest.approx([-LN2] * 5)
    for token, top in zip(tokens, tops):
        # The k likeliest, with the sampled token (here the likeliest itself) always there.
        assert len(top) == max(k, 1) and max(top, key=top.get) == token
        assert sorted(top.values(), reverse=True) == pytest.approx([-LN2 * r for r in range(1, max(k, 1) + 1)])


def test_logprobs_unasked_are_null(client: openai.OpenAI) -> None:
    assert chat(client, max_tokens=2).choices[0].logprobs is None
    assert client.completions.create(model="toy_llm", prompt="x", max_tokens=2).choices[0].logprobs is None


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_logprobs_from_a_model_that_gives_none_are_refused(client: openai.OpenAI, endpoint: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        if endpoint == "chat":
            client.chat.completions.create(model="echo_text", messages=[{"role": "user", "content": "x"}],
                                           logprobs=True, top_logprobs=2)
        else:
            client.completions.create(model="echo_text", prompt="x", logprobs=2)
    assert err.value.body == {
        "message": "Unsupported parameter: model 'echo_text' gives no log probabilities (it has no return_logprobs "
                   "input, STRING logprobs output and sampling_parameters input).",
        "type": "invalid_request_error", "param": "logprobs", "code": None}


@pytest.mark.parametrize("case, words", [
    ("null", "the response has text but no log probabilities"),
    ("malformed", "token 1: malformed JSON at byte 21: unexpected end of input"),
    ("nan", "token 1: \"logprob\" is NaN or Infinity"),
    ("no_logprob", "token 1: a token has no \"logprob\""),
    ("not_a_list", "not a JSON list of tokens"),
    ("empty_token", "token 1: no tokens"),
])
def test_bad_logprobs_from_the_model_fail_the_request_saying_why(served: openinfer.Server, client: openai.OpenAI,
                                                                  case: str, words: str) -> None:
    """Unstreamed: a 500 naming the model and what is wrong; streamed: the good chunk, then an
    error event and [DONE]."""
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="bad_logprobs", prompt=case, logprobs=1)
    message = err.value.body["message"]
    assert message.startswith("model 'bad_logprobs' gave a bad 'logprobs' output: ") and words in message, message
    payload = json.dumps({"model": "bad_logprobs", "prompt": case, "logprobs": 1, "stream": True}).encode()
    body = raw(served.http_port, post("/v1/completions", payload)).partition(b"\r\n\r\n")[2]
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert json.loads(events[0])["choices"][0]["logprobs"]["tokens"] == ["a"]
    assert json.loads(events[1])["error"]["message"] == message and events[2:] == [b"[DONE]"]


def test_an_unstreamed_answers_logprobs_count_toward_its_bound(client: openai.OpenAI) -> None:
    """1 byte of text but about 120 KB of logprobs a token: stopped at 64 MiB in all, not at 2000 tokens."""
    lengthy.reset()
    with pytest.raises(openai.InternalServerError, match="passed 64 MiB"):
        client.completions.create(model="long_logprobs", prompt="x", logprobs=0)
    assert lengthy.produced < 1000


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"n": 2}, "n", "only 1 is served"),
        ({"logprobs": 1}, "logprobs", "expected a boolean"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs", "from 0 to 20"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        ({"logprobs": True, "top_logprobs": 1.5}, "top_logprobs", "expected an integer"),
        ({"top_logprobs": 2}, "top_logprobs", "`top_logprobs` can only be used when `logprobs` is True"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
        ({"temperature": 3}, "temperature", "from 0 to 2"),
        ({"max_tokens": 0}, "max_tokens", "from 1 to 2147483647"),
        ({"max_tokens": 2**31}, "max_tokens", "from 1 to 2147483647"),
        ({"stop": 5}, "stop", "expected a string or an array of strings"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when 'stream' is enabled"),
        ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
    ],
)
def test_parameters_that_cannot_be_honoured_are_refused_by_name(
    client: openai.OpenAI, extra: dict[str, object], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="toy_llm", messages=[{"role": "user", "content": "x"}],
                                       extra_body=extra)
    assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body
    assert err.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"logprobs": -1}, "logprobs", "from 0 to 5"),
        ({"logprobs": 6}, "logprobs", "from 0 to 5"),
        ({"logprobs": True}, "logprobs", "expected an integer"),
        ({"logprobs": 2, "echo": True}, "echo", "no log probabilities of the prompt"),
    ],
)
def test_bad_completion_logprobs_are_refused_by_name(
    client: openai.OpenAI, extra: dict[str, object], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="toy_llm", prompt="x", extra_body=extra)
    assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body


def test_sampling_parameters_on_a_model_that_takes_none_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="echo_text", prompt="abc", temperature=0.5)
    assert err.value.body["param"] == "temperature" and "no sampling_parameters input" in err.value.body["message"]


def test_huge_max_tokens_is_the_models_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="toy_llm", prompt="x", max_tokens=2**31 - 1)
    assert "exceeds toy_llm's context of 4096 tokens" in err.value.body["message"]


def raw(port: int, request: bytes) -> bytes:
    """The whole answer to one request on its own connection (closed by the client after)."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
        sock.sendall(request)
        data = b""
        while not (data.endswith(b"0\r\n\r\n") or (b"\r\n\r\n" in data and _complete(data))):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def post(path: str, payload: bytes, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(payload)}\r\n".encode() + extra + b"\r\n"
            + payload)


def test_bad_json_is_400_with_openais_error_body(served: openinfer.Server) -> None:
    answer = raw(served.http_port, post("/v1/chat/completions", b'{"model": "toy_llm", "messages": [}'))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["message"] == ("We could not parse the JSON body of your request: malformed JSON at byte 34: "
                                "expected a value, got '}'")


def test_sse_framing_byte_for_byte(served: openinfer.Server) -> None:
    """Each event is one HTTP chunk holding "data: <json>\\n\\n"; the stream ends with
    "data: [DONE]\\n\\n" and the zero chunk."""
    payload = json.dumps({"model": "toy_llm", "prompt": "frame", "max_tokens": 3, "stream": True}).encode()
    answer = raw(served.http_port, post("/v1/completions", payload))
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nContent-Type: text/event-stream; charset=utf-8\r\n" in head + b"\r\n"
    assert b"\r\nTransfer-Encoding: chunked" in head
    events = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        chunk, rest = rest[:size], rest[size:]
        assert rest.startswith(b"\r\n")
        rest = rest[2:]
        if size == 0:
            break
        events.append(chunk)
    assert rest == b""
    assert events[-1] == b"data: [DONE]\n\n"
    texts = []
    for event in events[:-1]:
        assert event.startswith(b"data: {") and event.endswith(b"}\n\n") and event.count(b"\n\n") == 1
        texts.append(json.loads(event[6:])["choices"][0]["text"])
    assert len("".join(texts)) == 3


# ---- the client goes -----------------------------------------------------------------------------


def stream_request(model: str) -> bytes:
    payload = json.dumps({"model": model, "prompt": "x", "stream": True}).encode()
    return post("/v1/completions", payload)


def test_closing_mid_stream_cancels_the_models_request(served: openinfer.Server) -> None:
    gated.reset()
    gated.cancelled = False
    with socket.create_connection(("127.0.0.1", served.http_port), timeout=BOUND) as sock:
        sock.sendall(stream_request("gated_text"))
        data = b""
        while b'"text":"a"' not in data:
            chunk = sock.recv(65536)
            assert chunk, "closed before the first token"
            data += chunk
    # The model saw its request cancelled (it waits on the gate, which the test never opens),
    # and was closed at its next yield.
    gated.wait_for(lambda: gated.closed, "closed")
    assert gated.cancelled and not gated.finished


def test_a_client_that_never_reads_holds_the_model_back(served: openinfer.Server, client: openai.OpenAI) -> None:
    """The model pauses once the socket's buffers and the server's bound are full, rather than
    filling the server's memory with 20000 x 64 KiB tokens; the server serves others meanwhile."""
    flood.reset()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.settimeout(BOUND)
    sock.connect(("127.0.0.1", served.http_port))
    sock.sendall(stream_request("flood_text"))
    deadline, last, still = time.monotonic() + BOUND, -1, 0
    while time.monotonic() < deadline and still < 4 and not flood.finished:
        time.sleep(0.25)
        still = still + 1 if flood.produced == last else 0
        last = flood.produced
    assert not flood.finished and still >= 4, f"the model never paused: {flood.produced} produced"
    assert flood.produced < 1000, flood.produced
    assert client.completions.create(model="toy_llm", prompt="meanwhile", max_tokens=2).choices[0].text
    sock.close()
    flood.wait_for(lambda: flood.closed, "closed")


def test_an_unstreamed_answer_is_bounded(client: openai.OpenAI) -> None:
    """A decoupled model that streams anyway (64 KiB tokens, 20000 of them) when the client did
    not ask for a stream: stopped at 64 MiB of text, with why."""
    flood.reset()
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="flood_text", prompt="x")
    assert err.value.body["message"] == "the model's answer passed 64 MiB; ask for it with \"stream\": true"
    flood.wait_for(lambda: flood.closed, "closed")
    assert flood.produced < 2000


# ---- API key and TLS -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[openinfer.Server, Path]]:
    """The toy over TLS (a certificate of a CA made here) with an API key."""
    from test_tls import SERVER_EXT, _key_and_csr, _openssl, _sign

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    pki = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "30", "-subj", "/CN=openinfer test ca", cwd=pki)
    _key_and_csr(pki, "server", "localhost")
    _sign(pki, "server", "ca", SERVER_EXT)
    repo = tmp_path_factory.mktemp("secured")
    shutil.copytree(EXAMPLE, repo / "toy_llm")
    srv = openinfer.serve(repo, http_port=0, grpc_port=None, metrics_port=None, threads=1, log=False,
                          ssl={"server_cert": pki / "server.pem", "server_key": pki / "server.key"},
                          http_restricted_api=["openai:authorization=Bearer sekrit"])
    try:
        yield srv, pki / "ca.pem"
    finally:
        srv.stop()


def test_streamed_chat_over_tls_with_the_api_key(secured: tuple[openinfer.Server, Path]) -> None:
    srv, ca = secured
    base = f"https://localhost:{srv.http_port}/v1"
    verify = ssl.create_default_context(cafile=str(ca))
    with openai.DefaultHttpxClient(verify=verify) as http, \
            openai.OpenAI(base_url=base, api_key="sekrit", http_client=http, timeout=BOUND, max_retries=0) as c:
        chunks = list(c.chat.completions.create(model="toy_llm", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, max_tokens=4))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == c.chat.completions.create(
            model="toy_llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4).choices[0].message.content
        with pytest.raises(openai.AuthenticationError) as err:
            c.with_options(api_key="wrong").models.list()
        assert err.value.body == {"message": "Incorrect API key provided.", "type": "authentication_error",
                                  "param": None, "code": "invalid_api_key"}
        # Without the header at all; the V2 API stays open (only the group "openai" is restricted).
        bare = http.get(base + "/models")
        assert bare.status_code == 401 and bare.json()["error"]["message"].startswith("You didn't provide an API key")
        assert http.get(f"https://localhost:{srv.http_port}/v2/health/live").status_code == 200


@pytest.mark.parametrize("given", ["flag", "env"])
def test_cli_openai_api_key(tmp_path: Path, given: str) -> None:
    from conftest import Cli

    shutil.copytree(EXAMPLE, tmp_path / "toy_llm")
    flag = ["--openai-api-key", "k3y"] if given == "flag" else []
    env = {**os.environ, "OPENINFER_OPENAI_API_KEY": "k3y"} if given == "env" else None
    cli = Cli(str(tmp_path), *flag, "--grpc-port", "0", "--metrics-port", "0", env=env)
    try:
        if given == "env":  # the way to run in production: the key is not in the command line
            assert b"k3y" not in Path(f"/proc/{cli.proc.pid}/cmdline").read_bytes()
        base = f"http://127.0.0.1:{cli.port}/v1"
        with openai.OpenAI(base_url=base, api_key="k3y", timeout=BOUND, max_retries=0) as c:
            assert [m.id for m in c.models.list()] == ["toy_llm"]
            with pytest.raises(openai.AuthenticationError):
                c.with_options(api_key="nope").models.list()
    finally:
        cli.kill()


# ---- embeddings --------------------------------------------------------------------------------


def _floats(embedding: list[float] | str) -> list[float]:
    """An embedding as floats, whichever encoding it came in."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4").tolist()
    return np.array(embedding, dtype=np.float32).tolist()


# None: the SDK's default, which asks for base64 and decodes it itself.
@pytest.mark.parametrize("encoding", ["float", "base64", None])
def test_embeddings_of_one_string_and_of_several(client: openai.OpenAI, encoding: str | None) -> None:
    texts = ["hello", "two words", "é"]
    kw = {"encoding_format": encoding} if encoding else {}
    done = client.embeddings.create(model="embedder", input=texts, **kw)
    assert [d.index for d in done.data] == [0, 1, 2] and done.model == "embedder"
    assert [_floats(d.embedding) for d in done.data] == _vectors(texts).tolist()
    assert (done.usage.prompt_tokens, done.usage.total_tokens) == (16, 16)
    one = client.embeddings.create(model="embedder", input="hello", **kw)
    assert one.data[0].embedding == done.data[0].embedding


def test_embeddings_raw_float_and_base64_bodies(served: openinfer.Server) -> None:
    def ask(fmt: str) -> dict:
        payload = json.dumps({"model": "embedder", "input": "hi", "encoding_format": fmt}).encode()
        return json.loads(raw(served.http_port, post("/v1/embeddings", payload)).partition(b"\r\n\r\n")[2])

    assert ask("float")["data"][0]["embedding"] == [2.0, 0.209, 0.5, -1.25]
    assert base64.b64decode(ask("base64")["data"][0]["embedding"]) == _vectors(["hi"]).tobytes()


@pytest.mark.parametrize("model, extra, status, param", [
    ("toy_llm", {}, 400, "model"),
    ("embedder", {"dimensions": 2}, 400, "dimensions"),
    ("embedder", {"encoding_format": "int8"}, 400, "encoding_format"),
    ("embedder", {"input": [1, 2]}, 400, "input"),
    ("nope", {}, 404, "model"),
])
def test_embeddings_refusals(client: openai.OpenAI, model: str, extra: dict, status: int, param: str) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        client.embeddings.create(model=model, input=extra.pop("input", "x"), extra_body=extra)
    assert err.value.status_code == status and err.value.body["param"] == param, err.value.body


def test_routes_answer_wrong_methods_and_unknown_paths_in_openais_body(served: openinfer.Server) -> None:
    port = served.http_port
    for request, status, words in [
        (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405, "Method GET is not allowed for /v1/completions"),
        (b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405, "use GET"),
        (b"GET /v1/nothing HTTP/1.1\r\nHost: x\r\n\r\n", 404, "Invalid URL (GET /v1/nothing)"),
        (b"GET /v1/models/%zz HTTP/1.1\r\nHost: x\r\n\r\n", 404, "does not exist"),
    ]:
        head, _, body = raw(port, request).partition(b"\r\n\r\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
        assert words in json.loads(body)["error"]["message"]


def test_a_model_failing_mid_stream_sends_an_error_event_then_done(served: openinfer.Server,
                                                                    client: openai.OpenAI) -> None:
    answer = raw(served.http_port, stream_request("halfway_text"))
    body = answer.partition(b"\r\n\r\n")[2]
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert json.loads(events[0])["choices"][0]["text"] == "a"
    error = json.loads(events[1])["error"]
    assert "the model broke half way" in error["message"] and error["type"] == "server_error"
    assert events[2:] == [b"[DONE]"]
    with pytest.raises(openai.APIError, match="the model broke half way"):
        list(client.completions.create(model="halfway_text", prompt="x", stream=True))


def test_the_openai_group_is_http_only() -> None:
    with pytest.raises(ValueError, match="unknown restricted protocol 'openai'"):
        openinfer.serve(models=[], http_port=0, grpc_restricted_protocol=["openai:k=v"], log=False)


def test_requests_are_traced_as_infer_is(tmp_path: Path) -> None:
    """/v1 completions (streamed or not) and embeddings: one trace record each with the HTTP
    points around the model's; a request refused before the model is not traced."""
    from test_trace import HTTP_POINTS, read_traces

    path = tmp_path / "t.json"
    models = [Model("echo_text", _echo, **_text_io()),
              Model("embedder", _embed, inputs=[Tensor("text_input", "BYTES", [-1])],
                    outputs=[Tensor("embedding", "FP32", [-1, 4]), Tensor("num_input_tokens", "UINT32", [1])])]
    with openinfer.serve(models=models, http_port=0, log=False, trace_file=path,
                         trace_config=["level=TIMESTAMPS", "rate=1"]) as s, \
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", timeout=BOUND, max_retries=0) as c:
        assert c.completions.create(model="echo_text", prompt="ab").choices[0].text == "ba"
        assert "".join(ch.choices[0].text for ch in c.completions.create(model="echo_text", prompt="ab",
                                                                         stream=True)) == "ba"
        assert len(c.embeddings.create(model="embedder", input="x").data) == 1
        with pytest.raises(openai.BadRequestError):
            c.completions.create(model="echo_text", prompt="ab", n=3)
    traces = read_traces(path)
    assert [traces[i]["model_name"] for i in sorted(traces)] == ["echo_text", "echo_text", "embedder"]
    for t in traces.values():
        assert [name for name, _ in t["points"]] == HTTP_POINTS


def test_the_toys_tokenizer_json_counts_as_the_toy_does(client: openai.OpenAI) -> None:
    """examples/models/toy_llm/tokenizer.json (for aiperf and transformers) is what
    scripts/toy_tokenizer.py builds, and counts the server's tokens exactly."""
    tokenizers = pytest.importorskip("tokenizers")
    spec = importlib.util.spec_from_file_location("toy_tokenizer", EXAMPLE.parents[2] / "scripts" / "toy_tokenizer.py")
    assert spec is not None and spec.loader is not None
    toy_tokenizer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(toy_tokenizer)
    assert (EXAMPLE / "tokenizer.json").read_text(encoding="utf-8") == toy_tokenizer.build()
    tok = tokenizers.Tokenizer.from_file(str(EXAMPLE / "tokenizer.json"))
    done = chat(client, "héllo", max_tokens=12)
    prompt = "<|user|>héllo</s>\n<|assistant|>"
    assert done.usage.prompt_tokens == len(tok.encode(prompt).ids)
    assert done.usage.completion_tokens == len(tok.encode(done.choices[0].message.content).ids)


# ---- a model with names of its own, mapped in config.pbtxt --------------------------------------

RENAMED_PY = '''
import json

import numpy as np


def infer(inputs):
    n = json.loads(inputs["PARAMS"].reshape(-1)[0]).get("max_tokens", 4)
    for ch in inputs["PROMPT"].reshape(-1)[0].decode()[::-1][:n]:
        lp = json.dumps([{str(ord(ch)): {"logprob": -1.0, "rank": 1, "decoded_token": ch}}])
        yield {"TEXT": np.array([ch.encode()], dtype=np.object_), "N_OUT": np.array([1], dtype=np.uint32),
               "LP": np.array([lp.encode()], dtype=np.object_)}
'''


def _renamed(root: Path, parameters: dict[str, str]) -> Path:
    (root / "renamed" / "1").mkdir(parents=True)
    (root / "renamed" / "1" / "model.py").write_text(RENAMED_PY)
    params = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in parameters.items())
    (root / "renamed" / "config.pbtxt").write_text(
        'backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
        'input [{ name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] },'
        ' { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] optional: true },'
        ' { name: "WANT_LP" data_type: TYPE_BOOL dims: [ 1 ] optional: true }]\n'
        'output [{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },'
        ' { name: "N_OUT" data_type: TYPE_UINT32 dims: [ 1 ] }, { name: "LP" data_type: TYPE_STRING dims: [ 1 ] }]\n'
        + params
    )
    return root


RENAMING = {"openai_text_input": "PROMPT", "openai_text_output": "TEXT", "openai_sampling_parameters": "PARAMS",
            "openai_num_output_tokens": "N_OUT", "openai_return_logprobs": "WANT_LP", "openai_logprobs": "LP"}


def test_a_model_maps_its_own_tensor_names_in_config_pbtxt(tmp_path: Path) -> None:
    """A model whose tensors are not named text_input / text_output answers OpenAI's API once its
    config.pbtxt's openai_<convention> parameters name them; without them it answers none."""
    with openinfer.serve(_renamed(tmp_path / "mapped", RENAMING), http_port=0, grpc_port=None, log=False) as s, \
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", timeout=BOUND, max_retries=0) as c:
        assert [m.id for m in c.models.list().data] == ["renamed"]
        whole = c.completions.create(model="renamed", prompt="abcdef", max_tokens=3)
        assert whole.choices[0].text == "fed"
        assert whole.usage is None  # no num_input_tokens: no usage, as without the mapping
        pieces = [ch.choices[0].text for ch in c.completions.create(model="renamed", prompt="xyz", stream=True)]
        assert "".join(pieces) == "zyx" and len([p for p in pieces if p]) == 3
        assert c.completions.create(model="renamed", prompt="xyz", logprobs=0).choices[0].logprobs.tokens == list("zyx")
    with openinfer.serve(_renamed(tmp_path / "plain", {}), http_port=0, grpc_port=None, log=False) as s, \
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", timeout=BOUND, max_retries=0) as c:
        assert c.models.list().data == []
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="renamed", prompt="abc")


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        ({"openai_text_input": "NOPE"}, "parameters 'openai_text_input': the model declares no input 'NOPE'"),
        ({"openai_text_output": "PROMPT"}, "parameters 'openai_text_output': the model declares no output 'PROMPT'"),
        ({"openai_prompt": "PROMPT"}, "parameters 'openai_prompt': 'prompt' is no tensor of Triton's LLM conventions"),
    ],
)
def test_a_mapping_naming_no_such_tensor_fails_the_load_naming_it(
    tmp_path: Path, parameters: dict[str, str], error: str
) -> None:
    from openinfer._repository.repository import scan

    [entry] = scan(_renamed(tmp_path, parameters))
    assert entry.model is None and error in (entry.error or "")
