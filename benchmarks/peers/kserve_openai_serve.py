"""Peer: KServe's OpenAI-compatible server (`kserve.protocol.rest.openai`) serving openinfer's
deterministic toy language model (examples/models/toy_llm), for benchmarks/openai_peers.py.

    benchmarks/.venvs/kserve-openai/bin/python benchmarks/peers/kserve_openai_serve.py \
        --http-port P --grpc-port G --model-dir examples/models/toy_llm

The model is an `OpenAIChatAdapterModel`, KServe's base for a generative model that answers
chats through its completions: it renders the chat with the folder's chat template through
transformers (as a KServe model with a Hugging Face tokenizer does) and implements
create_completion, whole or streamed, one Server-Sent Event per byte token. The text is
toy_llm's own: tokenize() and continuation() are read from its model.py (below), so both
servers answer the same words for the same prompt. With KSERVE_OPENAI_ROUTE_PREFIX="" (set by
peers.py) the endpoints are /v1/completions and /v1/chat/completions, as openinfer's.
"""

from __future__ import annotations

import ast
import time
import uuid
from pathlib import Path

from kserve.errors import InvalidInput
from kserve.protocol.rest.openai import ChatPrompt, OpenAIChatAdapterModel
from kserve.protocol.rest.openai.types import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    UsageInfo,
)
from kserve_serve import serve
from transformers import AutoTokenizer


def toy_functions(model_py: Path) -> dict:
    """toy_llm's module-level constants and functions (tokenize, continuation), executed from
    its model.py without its Triton class and the imports that need Triton's Python backend or
    openinfer."""
    tree = ast.parse(model_py.read_text(), str(model_py))

    def wanted(node: ast.stmt) -> bool:
        if isinstance(node, ast.ImportFrom):
            return node.module == "__future__"
        if isinstance(node, ast.Import):
            return all(a.name != "triton_python_backend_utils" for a in node.names)
        return isinstance(node, (ast.Assign, ast.FunctionDef))

    tree.body = [n for n in tree.body if wanted(n)]
    namespace: dict = {}
    exec(compile(tree, str(model_py), "exec"), namespace)
    return namespace


class ToyLLM(OpenAIChatAdapterModel):
    def __init__(self, folder: Path):
        super().__init__(folder.name)
        toy = toy_functions(folder / "1" / "model.py")
        self.tokenize, self.continuation = toy["tokenize"], toy["continuation"]
        self.sampling_keys = sorted(toy["SAMPLING_KEYS"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))

    def apply_chat_template(self, request) -> ChatPrompt:
        prompt = self.tokenizer.apply_chat_template(request.messages, tokenize=False,
                                                    add_generation_prompt=True)
        return ChatPrompt(prompt=prompt)

    async def create_completion(self, request, raw_request=None, context=None):
        if not isinstance(request.prompt, str):
            raise InvalidInput("prompt: toy_llm takes one string")
        params = {k: getattr(request, k) for k in self.sampling_keys
                  if getattr(request, k, None) not in (None, [])}
        try:
            text, finish, _ = self.continuation(request.prompt, params)
        except ValueError as e:  # max_tokens beyond the context
            raise InvalidInput(str(e)) from None
        echo = request.prompt if request.echo else ""
        n_in, tokens = len(self.tokenize(request.prompt)), self.tokenize(text)
        ident, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if not request.stream:
            return Completion(id=ident, created=created, model=self.name, choices=[
                CompletionChoice(index=0, text=echo + text, finish_reason=finish)],
                usage=UsageInfo(prompt_tokens=n_in, completion_tokens=len(tokens),
                                total_tokens=n_in + len(tokens)))

        async def events():
            pieces = [bytes([t]).decode() for t in tokens] or [""]
            pieces[0] = echo + pieces[0]
            for i, piece in enumerate(pieces):
                chunk = CompletionChunk(id=ident, created=created, model=self.name, choices=[
                    CompletionChunkChoice(index=0, text=piece,
                                          finish_reason=finish if i == len(pieces) - 1 else None)])
                yield f"data: {chunk.model_dump_json()}\n\n"
            yield "data: [DONE]\n\n"

        return events()


if __name__ == "__main__":
    serve(lambda a: [ToyLLM(a.model_dir.resolve())],
          lambda ap: ap.add_argument("--model-dir", type=Path, required=True), enable_grpc=False)
