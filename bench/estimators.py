"""How far each token estimator is from real tokenizer counts, per kind of text.

Run: ``python bench/estimators.py`` (no network: every sample is embedded,
generated from a fixed seed, or read from the standard library's own source).
Prints Markdown tables; docs/BENCHMARKS.md ("Token estimators") holds a copy.

Each sample is cut into messages of about 2,000 characters, like tool results.
The truth for a message is its token count under a real tokenizer plus the
4 tokens of chat-template overhead every message carries; the estimators are
the three ``estimator`` settings of ``ContextBudgetPolicy`` applied to the same
messages. Error is (estimate - truth) / truth: negative means the proxy would
compact too late and risk an upstream rejection; positive, too early.

Truths: tiktoken ``o200k_base`` (GPT-4o, GPT-4.1, o-series) and ``cl100k_base``
(GPT-4, GPT-3.5), and, when the ``tokenizers`` package is present, the two
Hugging Face tokenizers litellm bundles (its Claude tokenizer, published for
Claude 1/2 and only a proxy for current Claude models, and DeepSeek V3's).
"""

# ruff: noqa: RUF001  (the Chinese sample is meant to contain full-width punctuation)

from __future__ import annotations

import inspect
import json
import random
import string
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.dialects import CHAT

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.context.view.budget import ContextBudgetPolicy
from proxy.context.view.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, bundled_encoding
from proxy.context.view.window import litellm_dir
from proxy.dialects.chat import message_hash
from proxy.types import Message

MESSAGE_CHARS = 2_000

ENGLISH = """\
The harbour town woke slowly that spring. Fishing boats came in later than they used to, and the market stalls
opened one by one as the fog lifted off the water. Nobody hurried; the season had been poor, and there was little
reason to rush towards a day that promised more of the same. Still, the baker kept his habit of putting the first
loaves in the window before six, and the smell drifted down to the quay where the old men sat mending nets.

When the new engineer arrived to survey the breakwater, people were curious rather than hopeful. Plans had come and
gone before. She walked the length of the wall twice, took photographs of every crack, and spent an afternoon in the
library reading reports that nobody had opened in twenty years. Her conclusion surprised everyone: the wall was not
failing because it was old, but because a channel dredged in the seventies had changed how the tide struck it.

Explaining that to the council took three meetings. The first went badly, since she spoke of scour and wave energy
and lost half the room within minutes. For the second she brought a tray of sand, a jug of water and a ruler, and
showed them what happened to a small model of the harbour when the channel was cut. The third meeting was short.
They voted to fill part of the channel and to rebuild the wall's foot with rock instead of concrete.

Good documentation is rarely about completeness. A reader arrives with a question and a limited amount of patience,
and the best pages answer the question first and explain the reasons afterwards. Examples matter more than prose:
one working example that can be copied, run and modified teaches more than three paragraphs describing the options.
It also helps to say plainly what a tool does not do, because that is where most confusion starts.

Teams that ship reliable software tend to share a few habits. They keep changes small enough to review in one
sitting. They write the test that reproduces a bug before they fix it, so the fix can be trusted and the bug cannot
quietly return. They treat warnings as errors, not because every warning matters, but because a build that is
always clean makes the one warning that does matter impossible to miss.

Memory is a strange thing to design around. People remember the outline of a long conversation and forget most of
its sentences, yet they rarely lose the decisions that were made or the promises that were given. A good summary
works the same way: it keeps goals, decisions, names and numbers, and lets the small talk go. What it must never do
is invent a decision that was not made, because a confident mistake is worse than an honest gap.
"""

CHINESE = """\
春天的港口小镇醒得很慢。渔船比往年回来得晚，雾气从水面散开以后，集市上的摊位才一个接一个地支起来。没有人着急，
这一季的收成不好，大家也没有理由急着迎接又一个平淡的日子。不过面包师傅还是保持着老习惯，六点以前就把第一炉面包
摆进橱窗，香味一直飘到码头，几位老人坐在那里补渔网。

新来的工程师到镇上勘察防波堤时，人们更多的是好奇，而不是期待。以前也有过不少方案，最后都不了了之。她沿着堤坝
走了两个来回，给每一道裂缝拍了照片，又在图书馆里待了一个下午，翻阅那些二十年没人打开过的报告。她的结论让所有人
都感到意外：堤坝出问题并不是因为年久失修，而是七十年代疏浚的一条航道改变了潮水冲击堤坝的方式。

向镇议会解释这一点花了三次会议。第一次很不顺利，她讲冲刷和波浪能量，没几分钟就有一半人听不下去了。第二次她带来
一盘沙子、一壶水和一把尺子，演示航道挖开以后港口模型会发生什么变化。第三次会议很短，议员们投票决定回填部分航道，
并且用石块而不是混凝土重建堤脚。

好的文档很少追求面面俱到。读者带着一个问题来，耐心有限，最好的页面先回答问题，再解释原因。示例比文字更重要：
一个可以复制、运行和修改的例子，胜过三段描述选项的说明。把工具不能做什么讲清楚也很有帮助，因为大多数困惑正是从
那里开始的。

能够稳定交付软件的团队往往有几个共同的习惯。他们让每次改动小到可以一次审查完。修复缺陷之前，先写出能复现它的
测试，这样修复才可信，缺陷也不会悄悄回来。他们把警告当作错误对待，并不是因为每个警告都重要，而是因为一个始终
干净的构建，能让真正重要的那个警告无处藏身。

在代码智能体的实际运行中，模型并不是简单地记住所有对话。随着用户输入、模型回答、工具调用和工具结果不断追加，
历史消息会迅速膨胀。一个运行二三十步的编码智能体，历史中可能已经积累几百条消息、几万个词元。压缩只作用于每次
调用前生成的模型视图，完整的事实日志永远不会被删除，因此即使摘要出了问题，原始记录依然可以用来重建视图。

记忆是一种很奇特的设计对象。人们记得一场长谈的大致脉络，却忘掉了大部分句子，但很少会忘记做过的决定和许下的承诺。
好的摘要也是这样：保留目标、决定、名称和数字，舍弃寒暄。它绝不能编造一个从未做出的决定，因为自信的错误比坦白的
空白更糟糕。
"""


def code_sample() -> str:
    """Real Python from the standard library: dense identifiers, indentation, punctuation."""
    import asyncio.queues
    import json.decoder

    return "\n".join(inspect.getsource(module) for module in (json.decoder, textwrap, asyncio.queues))


def json_sample(rng: random.Random) -> str:
    """Tool output as agents see it: file listings and API objects with ids, hashes, paths and numbers."""
    words = ["src", "proxy", "context", "tests", "store", "handlers", "utils", "config", "models", "api"]
    entries = []
    for i in range(60):
        path = "/".join(rng.choice(words) for _ in range(rng.randint(2, 4))) + rng.choice([".py", ".ts", ".md"])
        entries.append(
            {
                "id": i,
                "path": path,
                "size": rng.randint(10, 90_000),
                "sha": "".join(rng.choice("0123456789abcdef") for _ in range(40)),
                "modified": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:00:00Z",
                "owner": {"login": rng.choice(["alice", "bob", "ci-bot"]), "type": "User", "site_admin": False},
                "labels": rng.sample(["bug", "enhancement", "docs", "good first issue", "wontfix"], 2),
                "score": round(rng.random(), 4),
            }
        )
    return json.dumps({"total_count": len(entries), "incomplete_results": False, "items": entries}, indent=2)


def identifiers_sample(rng: random.Random) -> str:
    """The worst case for characters / 3: commit hashes, UUIDs, base64, random tokens."""
    alphabet = string.ascii_letters + string.digits
    lines = []
    for _ in range(120):
        sha = "".join(rng.choice("0123456789abcdef") for _ in range(40))
        key = "".join(rng.choice(alphabet) for _ in range(32))
        uuid = "-".join("".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12))
        lines.append(f"{sha} {uuid} {key}")
    return "\n".join(lines)


def messages_of(text: str) -> list[Message]:
    return [{"role": "tool", "content": text[i : i + MESSAGE_CHARS]} for i in range(0, len(text), MESSAGE_CHARS)]


def truths() -> dict[str, Callable[[str], int]]:
    """Real tokenizers, each as a function from text to token count."""
    found: dict[str, Callable[[str], int]] = {}
    import tiktoken

    o200k = bundled_encoding()
    if o200k is not None:
        found[f"tiktoken {o200k.name}"] = TokenCounter(o200k).text_tokens
    cl100k = tiktoken.get_encoding("cl100k_base")  # from the bundled files: main() points the cache there
    found["tiktoken cl100k_base"] = TokenCounter(cl100k).text_tokens
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return found
    root = litellm_dir()
    for label, name in (("Claude (litellm's)", "anthropic_tokenizer.json"), ("DeepSeek V3", "deepseek_tokenizer.json")):
        path = root / "litellm_core_utils" / "tokenizers" / name if root else None
        if path is not None and path.is_file():
            found[label] = hf_counter(Tokenizer.from_file(str(path)))
    return found


def hf_counter(tokenizer: Any) -> Callable[[str], int]:
    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count


def estimate(estimator: str, messages: list[Message]) -> int:
    policy = ContextBudgetPolicy(estimator=estimator, counter=TokenCounter())
    return sum(policy.message_tokens(CHAT, m) for m in messages)


def timing(messages: list[Message]) -> tuple[float, float]:
    """Milliseconds to count a conversation with a cold cache, and again after one message was added."""
    counter = TokenCounter()
    started = time.perf_counter()
    for m in messages:
        counter(m, message_hash(m))
    cold = time.perf_counter() - started
    extra = {"role": "user", "content": "one more message"}
    started = time.perf_counter()
    for m in [*messages, extra]:
        counter(m, message_hash(m))
    warm = time.perf_counter() - started
    return cold * 1000, warm * 1000


def main() -> None:
    import os

    tokenizers_dir = (litellm_dir() or Path()) / "litellm_core_utils" / "tokenizers"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tokenizers_dir)  # the cl100k truth column must not download either
    rng = random.Random(20240607)
    samples = {
        "English prose": ENGLISH,
        "Python source": code_sample(),
        "JSON tool output": json_sample(rng),
        "Chinese prose": CHINESE,
        "hashes and ids": identifiers_sample(rng),
    }
    real = truths()
    estimators = ("chars", "tokenizer", "max")
    print("| text | chars | messages | " + " | ".join(f"{name} tokens (chars/token)" for name in real) + " |")
    print("|---|---:|---:|" + "---:|" * len(real))
    for kind, text in samples.items():
        cells = [f"{t(text):,} ({len(text) / t(text):.2f})" for t in real.values()]
        print(f"| {kind} | {len(text):,} | {len(messages_of(text))} | " + " | ".join(cells) + " |")
    print()
    print("| text | truth | " + " | ".join(f"`{e}` error" for e in estimators) + " |")
    print("|---|---|" + "---:|" * len(estimators))
    worst = dict.fromkeys(estimators, 0.0)
    for kind, text in samples.items():
        messages = messages_of(text)
        guesses = {e: estimate(e, messages) for e in estimators}
        for name, count in real.items():
            truth = sum(count(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)
            errors = {e: (guesses[e] - truth) / truth for e in estimators}
            for e in estimators:
                worst[e] = min(worst[e], errors[e])
            print(f"| {kind} | {name} | " + " | ".join(f"{errors[e]:+.1%}" for e in estimators) + " |")
    print()
    print("Worst underestimate: " + ", ".join(f"`{e}` {worst[e]:+.1%}" for e in estimators))
    conversation = messages_of("".join(samples.values()) * 4)
    cold, warm = timing(conversation)
    print(f"\nTokenizer cost, {len(conversation)} messages: {cold:.1f} ms cold, {warm:.2f} ms with one new message.")


if __name__ == "__main__":
    main()
