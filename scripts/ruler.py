#!/usr/bin/env python3
"""RULER-style tasks for `fastgen eval --passkey`, from local text.

RULER (Hsieh et al., 2024) asks a model for things hidden in a long input at
a set length; kvpress runs it to rank KV-cache presses. These are tasks of
the same kinds, written from what every machine that runs this script has:
the docstrings of Python's standard library (the filler of needle.py, with
its dev / test split of the modules) and words drawn from them.

Tasks (--task):
  single      one access code ("The access code for the boathouse is
              48213."), asked for;
  multikey    four codes of four places, one asked for (the others distract);
  multivalue  four codes of one place, all asked for (the score: the share
              the answer holds);
  multiquery  four codes of four places, all asked: in one question (the
              prompt form), or as four questions each asked of a fork of the
              compressed document (the turns form);
  vt          variable tracking: VAR X = 12345, then four assignments that
              pass the value on (VAR Y = VAR X), spread through the text; the
              answer must name the five variables;
  cwe         common-word extraction: a numbered list of words, ten of them
              thirty times each (fewer below 4k tokens: cwe_frequency), the
              others three times; the answer must name the ten;
  qa          a question about one paragraph: the text is numbered
              documents, each a paragraph; which document says the sentence
              quoted in the question (the answer: its number).

Lengths (--length): the prompt's tokens under SmolLM2's tokenizer, to a few
per cent (the rate of this prose, measured); a document leaves 160 tokens of
the length for the question and the answer. Up to 0.9 of the split's prose
(Python 3.11's: about 19k tokens for test, 36k for dev), refused above.

Forms (--form), as needle.py's: `turns` (the default: the document prefilled
and compressed alone, the question in a later turn; the shape kvpress' RULER
runs, where the press does not see the question) or `prompt` (the question
ends the prompt). Every line is KEY<TAB>..., KEY one or more references
separated by '|' (fastgen eval --passkey scores the share found, letters in
either case, as RULER's string_match_all does).

Usage: ruler.py --task TASK [--length N] [--split dev|test] [--form turns|prompt]
                [--count N] [--seed S] [--plain] > task.txt
       ruler.py --list   (the tasks and the -n each needs, one a line)"""
import argparse
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from needle import CHARS_PER_TOKEN, paragraphs, passkey_line  # noqa: E402

# the greedy tokens each task's answer needs (fastgen eval -n)
TASKS = {"single": 12, "multikey": 12, "multivalue": 40, "multiquery": 40, "vt": 40, "cwe": 64, "qa": 12}
PLACES = ["archive", "boathouse", "observatory", "wine cellar", "greenhouse", "server room", "chapel",
          "garage", "lighthouse", "workshop", "gallery", "vault", "pantry", "attic", "studio", "stable"]
RESERVE = 160  # tokens of the length left to the question and the answer
LIST_WORD_TOKENS = 1.3  # a word of cwe's list under SmolLM2's tokenizer (a space and the word), measured
CWE_INTRO = ("Below is a numbered list of words. Some of them appear more often than others; memorize the ones "
             "that appear most often.")
CWE_QUESTION = "What are the 10 most common words in the list above?"
CWE_ANSWER = "The 10 words that appear most often in the list are:"
CWE_OWN_WORDS = set(re.findall(r"[a-z]+", (CWE_INTRO + CWE_QUESTION + CWE_ANSWER).lower()))


def prose(split):
    """needle.py's paragraphs of a split, less the few that the other split's modules hold too (a
    docstring re-exported under another module's name)."""
    other = set(paragraphs("test" if split == "dev" else "dev"))
    return [p for p in paragraphs(split) if p not in other]


def cwe_frequency(doc_tokens):
    """How often each of cwe's ten words comes: RULER's 30 from 4k tokens on, fewer below, so that
    three-times words keep at least half of the list."""
    return max(6, min(30, round(30 * doc_tokens / 3936)))


def filler(paras, rng, tokens, unique=False):
    """Paragraphs in a row from a random start, about `tokens` tokens of them: the last one cut
    after the word that reaches the length. unique: a paragraph that came already is passed over
    (a docstring that several classes inherit comes again in a row), up to one lap of the prose."""
    body, at, chars = [], rng.randrange(len(paras)), 0
    goal, end = tokens * CHARS_PER_TOKEN, at + len(paras)
    while chars < goal and (not unique or at < end):
        p = paras[at % len(paras)]
        if unique and p in body:
            at += 1
            continue
        if chars + len(p) > goal:
            cut = p.find(" ", int(goal - chars))
            p = p if cut < 0 else p[:cut]
        body.append(p)
        chars += len(p) + 2
        at += 1
    return body


def spread(body, rng, statements):
    """Inserts the statements into body in their order, each at a random depth in 10-90 %."""
    n0 = len(body)
    depths = sorted(0.1 + 0.8 * rng.random() for _ in statements)
    for depth, s in reversed(list(zip(depths, statements))):
        body.insert(round(n0 * depth), s)
    return body


def code(rng, taken):
    while True:
        c = str(rng.randint(10000, 99999))
        if c not in taken:
            taken.add(c)
            return c


def make(task, rng, paras, words, length):
    """One case: (intro, document text, [(key, question, answer's start)...], one_question)
    where one_question is the single question of the prompt form when the task asks several."""
    doc_tokens = length - RESERVE
    taken = set()
    if task in ("single", "multikey", "multiquery"):
        places = rng.sample(PLACES, 1 if task == "single" else 4)
        codes = [code(rng, taken) for _ in places]
        facts = [f"The access code for the {p} is {c}." for p, c in zip(places, codes)]
        rng.shuffle(facts)
        body = spread(filler(paras, rng, doc_tokens), rng, facts)
        qs = [(c, f"What is the access code for the {p}?", f"The access code for the {p} is")
              for p, c in zip(places, codes)]
        if task == "multikey":
            qs = [qs[rng.randrange(len(qs))]]
        one = None
        if task == "multiquery":
            names = ", the ".join(places[:-1]) + " and the " + places[-1]
            one = ("|".join(codes), f"What are the access codes for the {names}?",
                   "The access codes are")
        return "Here is a document. Read it carefully; a question about it follows.", "\n\n".join(body), qs, one
    if task == "multivalue":
        place = rng.choice(PLACES)
        codes = [code(rng, taken) for _ in range(4)]
        facts = [f"One of the access codes for the {place} is {c}." for c in codes]
        body = spread(filler(paras, rng, doc_tokens), rng, facts)
        qs = [("|".join(codes), f"What are all the access codes for the {place}?",
               f"The access codes for the {place} are")]
        return "Here is a document. Read it carefully; a question about it follows.", "\n\n".join(body), qs, None
    if task == "vt":
        names, value = [], code(rng, taken)
        while len(names) < 5:
            n = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
            if n not in names:
                names.append(n)
        chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i]} = VAR {names[i - 1]}." for i in range(1, 5)]
        body = spread(filler(paras, rng, doc_tokens), rng, chain)
        qs = [("|".join(names), f"Find all variables that are assigned the value {value} in the text above.",
               f"According to the chain of variable assignments in the text above, 5 variables are assigned "
               f"the value {value}; they are:")]
        return ("Memorize and track the chain of variable assignments hidden in the following text.",
                "\n\n".join(body), qs, None)
    if task == "cwe":
        pool = rng.sample(words, len(words))
        common = []  # ten of 5 letters or more, none inside another word of the list (the answer is matched
        for w in pool:  # by substring), none a word of the task's own text (an answer echoing it scores nothing)
            if (len(common) < 10 and len(w) >= 5 and w not in CWE_OWN_WORDS and
                    not any(w in c or c in w for c in common)):
                common.append(w)
        rare = [w for w in pool if w not in common and not any(c in w for c in common)]
        items = [w for w in common for _ in range(cwe_frequency(doc_tokens))]
        # rare words, three times each, until the list is the length: an item "N. word\n" is N's digits,
        # the dot, the word (one token or two: LIST_WORD_TOKENS) and the line's end
        item_tokens = lambda i: len(str(i)) + 2 + LIST_WORD_TOKENS  # noqa: E731
        n_rare, total = 0, sum(item_tokens(i + 1) for i in range(len(items)))
        while n_rare < len(rare) and total < doc_tokens:
            total += sum(item_tokens(len(items) + 3 * n_rare + j + 1) for j in range(3))
            n_rare += 1
        if total < doc_tokens:
            sys.exit(f"ruler.py: cwe: the split's {len(words)} words make a list of {total} tokens at most, "
                     f"not {doc_tokens}")
        items += [w for w in rare[:n_rare] for _ in range(3)]
        rng.shuffle(items)
        body = "\n".join(f"{i + 1}. {w}" for i, w in enumerate(items))
        qs = [("|".join(common), CWE_QUESTION, CWE_ANSWER)]
        return CWE_INTRO, body, qs, None
    if task == "qa":
        body = filler(paras, rng, doc_tokens * 0.96, unique=True)  # 0.96: the titles' tokens
        ids = rng.sample(range(100, 1000) if len(body) <= 900 else range(1000, 10000), len(body))
        # the document asked about: one at a depth of 10-90 % holding a sentence no other document holds
        order = sorted(range(len(body)), key=lambda i: abs(i - len(body) * (0.1 + 0.8 * rng.random())))
        gold, quote = None, None
        for g in order:
            sentences = [s for s in re.split(r"(?<=[.!?]) ", body[g]) if 8 <= len(s.split()) <= 40 and
                         sum(s in p for p in body) == 1]
            if sentences:
                gold, quote = g, rng.choice(sentences)
                break
        if gold is None:
            sys.exit("ruler.py: qa: no sentence of 8 to 40 words is in one paragraph only")
        docs = [f"Document {i}: {p}" for i, p in zip(ids, body)]
        qs = [(str(ids[gold]), f'Which document contains the sentence "{quote}"?', "The sentence is in Document")]
        return "Here are numbered documents. Read them carefully; a question about them follows.", \
            "\n\n".join(docs), qs, None
    raise ValueError(task)


def common_words(paras):
    """Lower-case words of 4 to 10 letters that the split's prose uses, in a stable order."""
    seen = set()
    for p in paras:
        for w in re.findall(r"\b[a-z]{4,10}\b", p):
            seen.add(w)
    return sorted(seen)


def cases(task, length, split, count, seed, form, paras=None):
    """The cases --task writes: (intro, document, questions), the questions those of the form (the prompt
    form's one)."""
    paras = paras if paras is not None else prose(split)
    words = common_words(paras)
    rng = random.Random(f"{seed}-{split}-{task}-{length}")
    for _ in range(count):
        intro, doc, qs, one = make(task, rng, paras, words, length)
        yield intro, doc, [one or qs[0]] if form == "prompt" else qs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=sorted(TASKS))
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--split", choices=("dev", "test"), default="dev")
    ap.add_argument("--form", choices=("turns", "prompt"), default="turns")
    ap.add_argument("--count", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for t, n in TASKS.items():
            print(t, n)
        return
    if not args.task:
        ap.error("--task is required")
    if args.length < 2 * RESERVE:
        ap.error(f"--length must be at least {2 * RESERVE} tokens")
    paras = prose(args.split)
    if not paras:
        sys.exit("ruler.py: no prose found in this Python's standard library")
    prose_tokens = sum(len(p) + 2 for p in paras) / CHARS_PER_TOKEN
    if args.length - RESERVE > 0.9 * prose_tokens:
        sys.exit(f"ruler.py: the {args.split} split's prose is about {prose_tokens:.0f} tokens: a document of "
                 f"{args.length - RESERVE} would repeat it (--length up to {int(0.9 * prose_tokens) + RESERVE})")
    for intro, doc, qs in cases(args.task, args.length, args.split, args.count, args.seed, args.form, paras):
        print(passkey_line(intro, doc, qs, args.form, args.plain))

if __name__ == "__main__":
    main()
