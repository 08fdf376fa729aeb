"""The shipped draft heads: τ of the EAGLE heads that ship for Gemma 3 270M and SmolLM2-135M-Instruct, by category
and by language, what they were trained on, and the EAGLE-3 pilot."""

from __future__ import annotations

import json

from .common import CPU, RESULTS, ROOT, Source, load, num, runs, table, x
from .vocab import MODELS

DATA = runs("heads")  # its runs and their provenance: benchmarks/render/runs.json

GEMMA = DATA["GEMMA"]  # fine-tune 4: the shipped Gemma head
GEMMA_BENCH, GEMMA_LANG = f"{GEMMA}/tau-specbench-broad.json", f"{GEMMA}/tau-languages-broad.json"
GEMMA_FT3, GEMMA_FT3_GO = f"{GEMMA}/tau-specbench-shipped.json", f"{GEMMA}/tau-go-shipped.json"  # the head before
FT3_LANG = DATA["FT3_LANG"]
PROMPTS = (DATA["LANGUAGE_PROMPTS"], f"{GEMMA}/prompts-go.jsonl")
SMOL = DATA["SMOL"]
TRAIN = {label: rel.replace("{GEMMA}", GEMMA) for label, rel in DATA["TRAIN"].items()}  # label -> training run
SMOL_FIRST = DATA["SMOL_FIRST"]
DATES = dict(zip(TRAIN.values(), DATA["TRAIN_DATES"]))  # the runs' days (not recorded)
PILOT, PILOT_BASE = DATA["PILOT"], DATA["PILOT_BASE"]
# each run's commit, by what the run is called in RUNS (the training runs by their label)
COMMITS = {**{globals()[name]: c for name, c in DATA["COMMITS"].items()},
           **{TRAIN[label]: c for label, c in DATA["TRAIN_COMMITS"].items()}}
CATS = {"mt_bench": "mt_bench", "translation": "translation", "summarization": "summarization", "qa": "qa",
        "math_reasoning": "math", "rag": "rag", "humaneval": "humaneval", "overall": "**overall**"}
LANGS = {"de": "German", "es": "Spanish", "fr": "French", "ja": "Japanese", "ru": "Russian", "zh": "Chinese",
         "th": "Thai", "sw": "Swahili", "fi": "Finnish", "pt": "Portuguese", "sv": "Swedish", "python": "Python",
         "java": "Java", "cpp": "C++", "javascript": "JavaScript", "go": "Go", "overall": "**all prompts**"}
SOURCES = {"mgsm": "MGSM", "genesis": "Genesis", "python3": "standard library", "jdk": "JDK", "c++": "libstdc++",
           "npm": "npm", "go-": "standard library"}  # a prompt's source path -> what it is


def tau_source(rel: str) -> Source:
    """The τ run's provenance, its command rebuilt from the fields it recorded."""
    d = load(rel)
    head = "" if d["head"].endswith(f"heads/{d['model']}") else " --head HEAD"
    cmd = (f"python benchmarks/measure/eagle_tau.py --model {d['model']} --dtype {d['dtype']}{head} --data "
           f"{' '.join(d['data'])} --per-category {d['per_category']} --max-new-tokens {d['max_new_tokens']} "
           f"--trees {','.join(d['trees'])}")
    return Source(rel, cmd, d["date"], CPU, COMMITS[rel])


def _trees(d: dict) -> str:
    name = {"eagle2": "EAGLE-2's tree", "cpu": "the CPU tree"}
    return " and ".join(f"{name[k]} ({t['total_tokens']} tokens, depth {t['depth']}, top-k {t['top_k']})"
                        for k, t in d["trees"].items())


def _by_category() -> list[str]:
    g, s, ft3 = load(GEMMA_BENCH), load(SMOL), load(GEMMA_FT3)
    rows = [[name, *(num(d["tau"][t][c]) for d in (g, s) for t in ("eagle2", "cpu"))] for c, name in CATS.items()]
    low = {MODELS[d["model"]]: sorted((v, CATS[c]) for c, v in d["tau"]["eagle2"].items() if c != "overall")[:2]
           for d in (g, s)}
    return ["### τ by category", "",
            f"Spec-Bench ({g['per_category']} questions per category) and HumanEval ({g['per_category']}), "
            f"{g['max_new_tokens']} new tokens, greedy, packed weights, full vocabulary, on {_trees(g)}. τ: committed "
            "tokens per target step, bonus token included, pooled over the prompts.", "",
            table(["category", "Gemma 3 270M: EAGLE-2 tree", "Gemma: CPU tree", "SmolLM2-135M-Instruct: EAGLE-2 "
                   "tree", "SmolLM2: CPU tree"], rows), "",
            tau_source(GEMMA_BENCH).markdown(), tau_source(SMOL).markdown(), "",
            f"- Every generation equals the target's own greedy output ({g['mismatches'] + s['mismatches']} "
            "mismatches).",
            *(f"- {m}: weakest {', '.join(f'{n} {v:.2f}' for v, n in low[m])} (EAGLE-2 tree)." for m in low),
            f"- Gemma's head before the broad fine-tune (fine-tune 3), same prompts: "
            f"{ft3['tau']['eagle2']['overall']:.2f} on EAGLE-2's tree, {ft3['tau']['cpu']['overall']:.2f} on the CPU "
            "tree: the broad text did not cost Spec-Bench τ.", ""]


def _source_of(lang: str) -> str:
    paths = {json.loads(line)["source"] for p in PROMPTS for line in (ROOT / "benchmarks" / "results" / p).open()
             if json.loads(line)["category"] == lang}
    return ", ".join(sorted({v for p in paths for k, v in SOURCES.items() if k in p.lower()}))


def _by_language() -> list[str]:
    d, old, go = load(GEMMA_LANG), load(FT3_LANG)["tau"]["eagle2"], load(GEMMA_FT3_GO)["tau"]["eagle2"]
    tau = d["tau"]["eagle2"]
    before = {**old, "go": go["go"]}
    rows = [[LANGS[k], None if k == "overall" else _source_of(k), num(v)] for k, v in tau.items()]
    langs = [k for k in tau if k != "overall"]
    low = sorted(langs, key=tau.get)[:4]
    up = [k for k in langs if tau[k] > before[k]]
    return ["### τ by language (Gemma 3 270M, held-out sources)", "",
            "Text from none of the head's training sources, 2 prompts per language "
            "(`benchmarks/data/language_prompts.py`): MGSM questions followed by \"Answer:\" (an evaluation set, "
            "never trained on), Genesis passages to continue, and source files from the system's libraries; "
            f"{d['max_new_tokens']} tokens, greedy, packed weights, on {_trees(d)}.", "",
            table(["language", "source", "τ"], rows), "", tau_source(GEMMA_LANG).markdown(), "",
            f"- Lowest: {', '.join(f'{LANGS[k]} {tau[k]:.2f}' for k in low)}.",
            "- The MGSM figures are the base model restating a word problem and stepping through its numbers, which "
            "the head predicts well; they do not show that the head knows those languages.",
            f"- Against the head before the broad fine-tune on the same prompts, τ rose in {len(up)} of {len(langs)} "
            f"languages (not in {', '.join(LANGS[k] for k in langs if k not in up)}); two prompts a language make each "
            "row noisy.", ""]


CE_VOCAB = {"full": "every id", "seen": "the ids seen", "batch": "the target's top-32, the batch's candidates"}


def _train_s(t: dict) -> float:
    """The training stage's seconds over the whole run (a resumed run's pieces summed), else the run's wall time."""
    train = (t.get("stage_rates") or {}).get("train")
    return train["seconds"] if train and "seconds" in train else t["wall_s"]


def _training() -> list[str]:
    rows = []
    for name, rel in TRAIN.items():
        t = load(rel)
        c = t["config"]
        epochs = f"{c['epochs']:g}" + (f" (after {load(SMOL_FIRST)['config']['epochs']:g})" if "v2" in rel else "")
        top3 = t["heldout"].get("top3")
        data = t.get("trained_data")  # what was trained, by source (else: the run's own answers and texts)
        answers = f"{data['answers']['sequences']:,} ({data['answers']['positions']:,} positions)" if data else \
            f"{t['answers']:,} ({t['answer_tokens']:,} tokens)" if t["answers"] else None
        rows.append([name, answers, f"{data['text']['positions']:,}" if data else f"{t['text_tokens']:,}",
                     f"{t['train_tokens_per_epoch']:,}", epochs, t["steps"],
                     CE_VOCAB[c["ce_vocab"]], f"{_train_s(t) / 60:.0f}",
                     f"{t['heldout']['top1']:.3f}" + (f" / {top3:.3f}" if top3 is not None else ""),
                     "CPU" if t["device"].startswith("cpu") else t["device"]])
    gemma = load(TRAIN["Gemma 3 270M (fine-tune 4)"])
    stages = json.loads((ROOT / "src/microspec/heads/gemma-3-270m/training.json").read_text())["stages"]
    return ["### What the heads were trained on", "",
            "Self-distilled: the target's own greedy answers to training-side prompts and the target's own "
            "predictions on plain text are the labels; no evaluation set. Each row is one `microspec train` run "
            "(its `training.json`):", "",
            table(["head", "answers", "text tokens", "positions per epoch", "epochs", "steps", "cross-entropy over",
                   "train min", "held-out top-1 / top-3", "device"], rows), "",
            *(Source(rel, load(rel)["command"].split(" --")[0] + " …", DATES[rel],
                     f"2-core {load(rel)['machine'].split(',')[0]}, 2 threads" if "machine" in load(rel) else CPU,
                     COMMITS[rel]).markdown() for rel in TRAIN.values()), "",
            f"- The shipped Gemma head is the last of {len(stages)} stages: answers and a first training on an H100, "
            f"then {sum(st['what'].startswith('fine-tune') for st in stages)} fine-tunes on this CPU, each from "
            "the head before (every stage's command and data: `src/microspec/heads/gemma-3-270m/training.json`). "
            "Fine-tune 4 also replays "
            f"{len(gemma['extra_features'])} feature shards of an earlier run's answers and text.",
            "- Held-out top-1 is measured on each run's own held-out mix (text-heavy for Gemma's last stage), so it "
            "does not compare across rows; τ above does.", ""]


def _pilot() -> list[str]:
    p, b, t = load(PILOT), load(PILOT_BASE), load(TRAIN["EAGLE-3 pilot, Gemma 3 270M (not shipped)"])
    rows = [[name, *(num(d["tau"][tr][c]) for d in (p, b) for tr in ("eagle2", "cpu"))] for c, name in CATS.items()]
    ratio = p["tau"]["eagle2"]["overall"] / b["tau"]["eagle2"]["overall"]
    return ["### The EAGLE-3 pilot", "",
            f"An EAGLE-3 head trained on this CPU as a pilot (`microspec train eagle3`: features tapped at layers "
            f"{', '.join(map(str, t['feature_layers']))}, {t['ttt_steps']} training-time-test steps, a "
            f"{t['draft_vocab']:,}-id draft vocabulary; its data in the table above). Not shipped. τ beside the "
            f"EAGLE-2 head Gemma shipped then (fine-tune 3), {p['per_category']} prompt per category, "
            f"{p['max_new_tokens']} tokens, greedy, packed weights:", "",
            table(["category", "EAGLE-3 pilot: EAGLE-2 tree", "pilot: CPU tree", "EAGLE-2 head: EAGLE-2 tree",
                   "EAGLE-2 head: CPU tree"], rows), "",
            tau_source(PILOT).markdown(), tau_source(PILOT_BASE).markdown(), "",
            f"- The pilot reaches {ratio:.2f}x the EAGLE-2 head's τ on EAGLE-2's tree "
            f"({p['mismatches'] + b['mismatches']} mismatches). It saw {t['train_tokens_per_epoch']:,} positions "
            f"{t['config']['epochs']:g} times; its held-out top-1 was {t['heldout']['top1']:.3f} at training-time-test "
            f"step 0 and {t['heldout']['top1_step2']:.3f} at step 2: a budget too small to judge the method by.", ""]


GPU = DATA["GPU"]
CPU_AVX512 = "2-core AMD EPYC (AVX-512), 2 threads"
GPU_H200 = DATA["GPU_H200"]
GPU_TAU = {"shipped EAGLE-1 head": f"{GPU}/tau-old-held", "EAGLE-1, fine-tuned on an H100": f"{GPU}/tau-e1new-held",
           "EAGLE-3, trained on an H100": f"{GPU}/tau-e3-held",
           "EAGLE-3, trained on an H200": f"{GPU_H200}/tau-e3-held"}
GPU_TRAIN = {"EAGLE-1, fine-tuned on an H100": f"{GPU}/training-eagle1.json",
             "EAGLE-3, trained on an H100": f"{GPU}/training-eagle3.json",
             "EAGLE-3, trained on an H200": f"{GPU_H200}/training-eagle3.json"}


def _gpu_source(rel: str) -> Source:
    d = load(rel)
    cmd = (f"python benchmarks/measure/eagle_tau.py --model {d['model']} --dtype {d['dtype']} --head HEAD --data "
           f"benchmarks/results/{GPU}/prompts.jsonl --per-category {d['per_category']} --max-new-tokens "
           f"{d['max_new_tokens']} --trees {','.join(d['trees'])}"
           + (f" --repetition-penalty {d['repetition_penalty']:g}" if d["repetition_penalty"] != 1.0 else ""))
    return Source(rel, cmd, d["date"].split(" ")[0], CPU_AVX512, d.get("commit") or "not recorded")


def _gpu_heads() -> list[str]:
    folder = ROOT / "benchmarks" / "results" / GPU
    runs = {(name, dec): f"{stem}-{dec}.json" for name, stem in GPU_TAU.items() for dec in ("greedy", "pen")
            if (ROOT / "benchmarks" / "results" / f"{stem}-{dec}.json").is_file()}
    rows = []
    for name in GPU_TAU:
        cells = []
        for dec in ("greedy", "pen"):
            rel = runs.get((name, dec))
            cells += [num(load(rel)["tau"][t]["overall"]) if rel else None for t in ("eagle2", "cpu")]
        rows.append([name, *cells])
    train = []
    for name, rel in GPU_TRAIN.items():
        t = load(rel)
        train.append([name, f"{t['answers']:,} ({t['answer_tokens']:,} tokens)", t["steps"], f"{t['wall_s']:.0f}",
                      f"{t['heldout']['top1']:.3f}"])
    g = load(f"{GPU}/tau-old-held-greedy.json")
    e3a, e3b, e1 = (load(GPU_TRAIN[k]) for k in ("EAGLE-3, trained on an H100", "EAGLE-3, trained on an H200",
                                                 "EAGLE-1, fine-tuned on an H100"))

    def tau(name: str) -> str | None:
        rel = runs.get((name, "greedy"))
        return num(load(rel)["tau"]["eagle2"]["overall"]) if rel else None

    taus = [(name, tau(name)) for name in ("EAGLE-3, trained on an H100", "EAGLE-3, trained on an H200")]
    measured = " and ".join(f"{v} ({name.split(', ', 1)[1]})" for name, v in taus if v)

    prompts = sum(1 for _ in (folder / "prompts.jsonl").open())
    mism = sum(load(rel)["mismatches"] for rel in runs.values())
    return ["### Heads trained on a GPU (not shipped)", "",
            "EAGLE-3 heads and a fine-tune of the shipped EAGLE-1 head, each trained in one call on an H100 80GB or "
            "an H200 (answers by the bf16 target, greedy and with repetition penalty 1.2, to prompts of the training "
            "pool; `benchmarks/gpu_train.py`), "
            f"measured here against the shipped head on {prompts} held-apart prompts (MT-bench second turns, "
            "multilingual text, code; none from the training pool), "
            f"{g['max_new_tokens']} tokens, packed weights, τ pooled over the prompts (– : not measured from a "
            "committed tree):", "",
            table(["head", "greedy: EAGLE-2 tree", "greedy: CPU tree", "penalty 1.2: EAGLE-2 tree",
                   "penalty 1.2: CPU tree"], rows), "",
            table(["trained head", "answers", "steps", "wall s (on the GPU)", "held-out top-1"], train), "",
            *(_gpu_source(rel).markdown() for rel in runs.values()), "",
            f"- Every generation equals the target's own greedy output ({mism} mismatches).",
            "- The fine-tuned EAGLE-1 head is within a few percent of the shipped one (a little higher greedy on "
            "EAGLE-2's tree, a little lower under the penalty): not worth replacing it, so the DynaSpec, SpecVocab "
            "and CORAL routers trained on the shipped head stay as they are.",
            f"- The EAGLE-3 heads saw about {e3a['train_tokens_per_epoch'] / 1e6:.1f}M answer positions per epoch "
            f"({e3a['steps']} optimizer steps on the H100, {e3b['steps']} on the H200): the longer run lifted "
            f"held-out top-1 from {e3a['heldout']['top1']:.3f} to {e3b['heldout']['top1']:.3f}; τ on EAGLE-2's "
            f"tree {measured}, far below the shipped EAGLE-1 head's {tau('shipped EAGLE-1 head')} (the fine-tune of "
            f"it: held-out top-1 {e1['heldout']['top1']:.3f}). Neither is shipped; the EAGLE-1 head stays the "
            "default.", ""]


E1_H200 = DATA["E1_H200"]
E1_HEADS = {"shipped EAGLE-1 head": "shipped", "EAGLE-1 from it, 3,500 prompts (e1b)": "e1b",
            "EAGLE-1 from it, 1,500 prompts (e1)": "e1"}


def _eagle1_h200() -> list[str]:
    """The EAGLE-1 heads retrained on an H200 from the shipped one, against it on a held-apart set of their own."""
    rows, srcs = [], []
    for name, key in E1_HEADS.items():
        cells = []
        for dec in ("greedy", "pen"):
            rel = f"{E1_H200}/tau-{key}-{dec}.json"
            d = load(rel) if (ROOT / "benchmarks" / "results" / rel).is_file() else None
            cells += [num(d["tau"][t]["overall"]) if d else None for t in ("eagle2", "cpu")]
            if d:
                srcs.append(Source(rel, d["command"].replace(d["head"], "HEAD").rsplit(" --out", 1)[0],
                                   d["date"].split(" ")[0], CPU_AVX512, d["commit"]))
        rows.append([name, *cells])
    train = [[n, f"{t['answers']:,} ({t['answer_tokens']:,} tokens)", t["steps"], f"{t['wall_s']:.0f}",
              f"{t['heldout']['top1']:.3f}"]
             for n, t in ((n, load(f"{E1_H200}/training-{k}.json")) for n, k in E1_HEADS.items() if k != "shipped")]
    decs = {"greedy": "greedy", "pen": "under the penalty"}
    tau = {dec: {k: load(f"{E1_H200}/tau-{k}-{dec}.json")["tau"]["eagle2"]["overall"] for k in ("shipped", "e1b")}
           for dec in decs if all((RESULTS / E1_H200 / f"tau-{k}-{dec}.json").is_file() for k in ("shipped", "e1b"))}
    wins = sum(t["e1b"] > t["shipped"] for t in tau.values())
    return ["#### EAGLE-1 retrained on an H200 (not shipped)", "",
            "Warm-started from the shipped head, one device call each (`gpu_train.py --arch eagle --init "
            "src/microspec/heads/gemma-3-270m`, its own answers to training-pool prompts, plain and with penalty "
            "1.2, bf16 target); τ on 12 held-apart prompts of their own (`benchmarks/data/held_apart.py "
            "--per-category 4 --seed 2026`), packed target (– : not measured from a committed tree; see the "
            "folder's README):", "",
            table(["head", "greedy: EAGLE-2 tree", "greedy: CPU tree", "penalty 1.2: EAGLE-2 tree",
                   "penalty 1.2: CPU tree"], rows), "",
            table(["trained head", "answers", "steps", "wall s (on the GPU)", "held-out top-1"], train), "",
            *(s.markdown() for s in srcs), "",
            "- e1b: " + " and ".join(f"{x(t['e1b'] / t['shipped'])} the shipped head's τ {decs[dec]}"
                                     for dec, t in tau.items())
            + " (EAGLE-2's tree), where the shipped head's last fine-tunes trained on penalised features: "
            + (f"it wins in {wins} of the {len(tau)} decodings measured, so the shipped head stays."
               if wins < len(tau) else f"it wins in the {len(tau)} decodings measured."), ""]


CPU_HEAD = DATA["CPU_HEAD"]  # the head trained on the packed engine (`train eagle`'s top-K loss)
# the later fine-tunes on the packed engine, the last shipped: {"DIR", "NAME", "BEFORE", "REPORT"} each
CPU_HEADS: list[dict] = list(DATA.get("CPU_HEADS", []))
SETS = {"dev": "development set", "report": "reporting set"}
HEADS = {"shipped": "fine-tune 4 (the head before)", "new": "fine-tune 5"}
PENALTIES = {"1.0": "greedy", "1.2": "penalty 1.2"}


def _recorded(rel: str, d: dict, command: str) -> Source:
    """Where a figure comes from, for a results file ``rel`` that records its own run (``d``: its date, machine and
    commit; this CPU's 2 threads) and the ``command`` shown for it."""
    return Source(rel, command, d["date"].split(" ")[0], d["machine"] + ", 2 threads", d["commit"])


def _rate_row(name: str, r: dict | None) -> list:
    return [name, f"{r['positions']:,}", f"{r['seconds']:,.0f}", f"{r['positions_per_s']:,.0f}"] if r else \
        [name, None, None, None]


def _cpu_trained() -> list[str]:
    """The Gemma head trained on this CPU through the packed engine: the stages' rates, and τ against the head
    before on a development set (which chose what ships) and a reporting set (which chose nothing)."""
    t, r = load(f"{CPU_HEAD}/training.json"), load(f"{CPU_HEAD}/rates.json")
    taus = {(s, h, p): load(f"{CPU_HEAD}/tau-{s}-{h}-p{p}.json") for s in SETS for h in HEADS for p in PENALTIES}
    rows = [[name, *(num(taus[(s, h, p)]["tau"]["chain6"]["overall"]) for s in SETS for p in PENALTIES)]
            for h, name in HEADS.items()]
    rates = r["stage_rates"]
    ratio = {k: taus[(k[0], "new", k[1])]["tau"]["chain6"]["overall"]
             / taus[(k[0], "shipped", k[1])]["tau"]["chain6"]["overall"]
             for k in ((s, p) for s in SETS for p in PENALTIES)}
    cats = {s: [k for k in taus[(s, "new", "1.0")]["tau"]["chain6"] if k != "overall"] for s in SETS}
    wins = {s: sum(taus[(s, "new", p)]["tau"]["chain6"][k] > taus[(s, "shipped", p)]["tau"]["chain6"][k]
                   for k in cats[s] for p in PENALTIES) for s in SETS}
    mism = sum(d["mismatches"] for d in taus.values())
    dev, rep, c = taus[("dev", "new", "1.0")], taus[("report", "new", "1.0")], t["config"]
    data = t["trained_data"]
    return ["### Gemma's head trained on the CPU through the packed engine (fine-tune 5)", "",
            "`microspec train eagle` with its defaults on a GGUF model: the target's features and top-32 next "
            "tokens captured on the packed kernels inference uses; the token loss the target's top-32 against the "
            "draft's softmax over each micro-batch's candidate ids (no target forward and no 262k-row LM head in "
            "training); the head's products in bf16 where the CPU has bf16 instructions. The stages' rates, one "
            "run of capture and training on a slice of C4 text:", "",
            table(["stage", "positions", "seconds", "positions/s"],
                  [_rate_row("capture (target forward, LM head, top-32)", rates.get("capture")),
                   _rate_row("train (head forward and backward, candidate loss)", rates.get("train"))]), "",
            _recorded(f"{CPU_HEAD}/rates.json", r, r["command"]).markdown(), "",
            "- A position is captured once and trained once per epoch, so at E epochs a trained position costs "
            "1 / (E x capture rate) + 1 / (train rate) seconds.",
            "- The answers are generated through the engine itself, 8 at a time (the first stage of "
            f"`training.json`'s last entry: {_gen_rate(t)} answer tokens/s).", "",
            f"Fine-tune 5 of the Gemma 3 270M head started from fine-tune 4 and trained "
            f"{t['trained_positions']:,} positions ({c['epochs']:g} epochs over {data['text']['positions']:,} "
            f"positions of teacher-forced text and {data['answers']['positions']:,} of "
            f"{data['answers']['sequences']:,} "
            "of the target's own answers, greedy, with penalty 1.2, at T 0.7 and both); held-out top-1 "
            f"{t['heldout']['top1']:.3f} on its own mix. τ (tokens committed per target step) on a chain of 6 draft "
            "tokens, 128 tokens, packed weights, on the development set "
            f"({dev['per_category']} prompts per category of `benchmarks/data/held_apart.py --seed 2026`: "
            "MT-bench two-turn, MGSM, HumanEval / MBPP), which chose what ships, and on the reporting set "
            f"({rep['per_category']} prompts per category of Spec-Bench's translation, summarization, qa and rag, "
            "sources the development set does not use), which chose nothing:", "",
            table(["head", *(f"{SETS[s]}: {PENALTIES[p]}" for s in SETS for p in PENALTIES)], rows), "",
            _recorded(f"{CPU_HEAD}/training.json", t, t["command"].split(" --")[0] + " …").markdown(),
            *(_recorded(f"{CPU_HEAD}/tau-{s}-{h}-p{p}.json", d,
                        d["command"].replace(d["head"], "HEAD").rsplit(" --out", 1)[0]).markdown()
              for (s, h, p), d in taus.items()), "",
            f"- Every generation equals the target's own greedy output ({mism} mismatches).",
            f"- Fine-tune 5's τ is {x(ratio[('dev', '1.0')])} / {x(ratio[('dev', '1.2')])} fine-tune 4's on the "
            f"development set (greedy / penalty 1.2; higher in {wins['dev']} of its {2 * len(cats['dev'])} category "
            f"x decoding cells) and {x(ratio[('report', '1.0')])} / {x(ratio[('report', '1.2')])} on the reporting "
            f"set (higher in {wins['report']} of {2 * len(cats['report'])}).", ""]


def _tau(rel: str) -> float:
    return load(rel)["tau"]["chain6"]["overall"]


def _cpu_fine_tune(run: dict) -> list[str]:
    """A fine-tune of a model's head on the packed engine (runs.json heads.CPU_HEADS, ``MODEL``: Gemma's where not
    named): its data, the development set's τ as it trained (the head exported after each piece of the run), and τ
    against the head before on the development and the reporting set."""
    d, name, before, model = run["DIR"], run["NAME"], run["BEFORE"], run.get("MODEL", "Gemma")
    t = load(f"{d}/training.json")
    data, c = t["trained_data"], t["config"]
    curve = load(f"{d}/curve.json")  # {"points": [{"tag", "positions"}]}: the pieces' heads, in order
    taus = {(s_, h, p_): f"{d}/tau-{s_}-{h}-p{p_}.json" for s_ in SETS for h in ("before", "new") for p_ in PENALTIES}
    rows = [[f"{before} (start)", "0", *(num(_tau(taus[("dev", "before", p_)])) for p_ in PENALTIES)]]
    rows += [[pt.get("label", f"after piece {i + 1}"), f"{pt['positions']:,}",
              *(num(_tau(f"{d}/tau-dev-{pt['tag']}-p{p_}.json")) for p_ in PENALTIES)]
             for i, pt in enumerate(curve["points"])]
    cmp_rows = [[label, *(num(_tau(taus[(s_, h, p_)])) for s_ in SETS for p_ in PENALTIES)]
                for h, label in (("before", f"{before} (the head before)"), ("new", name))]
    files = list(taus.values()) + [f"{d}/tau-dev-{pt['tag']}-p{p_}.json" for pt in curve["points"]
                                   for p_ in PENALTIES]
    mism = sum(load(f)["mismatches"] for f in files)
    one = load(taus[("report", "new", "1.0")])
    return [f"### {model}'s head, {name}", "",
            f"From {before}, {t['trained_positions']:,} positions trained ({c['epochs']:g} epochs over "
            f"{data['text']['positions']:,} positions of teacher-forced text and {data['answers']['positions']:,} "
            f"of {data['answers']['sequences']:,} of the target's own answers in the four decodings), in "
            f"{_pieces(curve.get('pieces', len(curve['points'])))} of one resumable run; held-out top-1 "
            f"{t['heldout']['top1']:.3f} on its own mix. The development set's τ (chain of 6 draft tokens, 128 "
            "tokens, packed weights) as it trained (the learning rate decays over the whole run, so a head part-way "
            "is not a finished one):", "",
            table(["head", "positions trained", *(f"dev: {v}" for v in PENALTIES.values())], rows), "",
            f"{name[0].upper()}{name[1:]} against {before} on the development set (`benchmarks/data/dev.jsonl`), "
            "which chose what "
            "ships, and on the reporting set (`benchmarks/data/report.jsonl`), which chose nothing:", "",
            table(["head", *(f"{SETS[s_]}: {PENALTIES[p_]}" for s_ in SETS for p_ in PENALTIES)], cmp_rows), "",
            _recorded(f"{d}/training.json", t, t["command"].split(" --")[0] + " …").markdown(),
            _recorded(f"{d}/tau-*.json", one, one["command"].replace(one["head"], "HEAD").rsplit(" --out", 1)[0]
                      .replace("benchmarks/data/report.jsonl", "benchmarks/data/<set>.jsonl")).markdown(), "",
            f"- Every generation equals the target's own greedy output ({mism} mismatches over "
            f"{len(files)} runs).", _still_rising(d, curve), ""]


def _pieces(n: int) -> str:
    return "one piece" if n == 1 else f"{n} pieces"


def _still_rising(d: str, curve: dict) -> str:
    """Whether the development set's greedy τ still rose over the run's last part (its last two heads)."""
    last, prev = (_tau(f"{d}/tau-dev-{pt['tag']}-p1.0.json") for pt in curve["points"][-1:-3:-1])
    gained = last - prev
    report = [_tau(f"{d}/tau-report-new-p{p_}.json") - _tau(f"{d}/tau-report-before-p{p_}.json") for p_ in PENALTIES]
    moved = (f"; on the reporting set, against the head before, τ moved by {report[0]:+.2f} greedy and "
             f"{report[1]:+.2f} under penalty 1.2")
    return (f"- The development set's greedy τ rose by {gained:.2f} over the run's last part: it had not stopped "
            f"rising when the run ended, so more positions should still pay{moved}." if gained > 0.02 else
            f"- The development set's greedy τ moved by {gained:+.2f} over the run's last part: it has stopped "
            f"rising{moved}.")


def _gen_rate(t: dict) -> str:
    g = t["stages"][-1]["rates"]["generate (answer tokens)"]
    return f"{sum(r['positions'] for r in g) / sum(r['seconds'] for r in g):,.0f}"


def _eagle2_tau() -> list[str]:
    """The shipped heads on EAGLE-2's tree over the full vocabulary, on the reporting set (runs.json
    heads.EAGLE2_TAU: a τ file per model)."""
    if "EAGLE2_TAU" not in DATA:
        return []
    files = DATA["EAGLE2_TAU"]
    runs = {m: load(rel) for m, rel in files.items()}
    first = next(iter(runs.values()))
    cats = [c for c in first["tau"]["eagle2"] if c != "overall"]
    rows = [[MODELS.get(m, m), *(num(d["tau"]["eagle2"][c]) for c in cats), num(d["tau"]["eagle2"]["overall"])]
            for m, d in runs.items()]
    mism = sum(d["mismatches"] for d in runs.values())
    return [f"The shipped heads on {_trees(first)}, full vocabulary, greedy, {first['max_new_tokens']} tokens, "
            f"packed weights, on the reporting set's {len(first['tau']['eagle2']) - 1} categories "
            f"(`benchmarks/data/report.jsonl`; {mism} mismatches with the target's own greedy output):", "",
            table(["head: τ on EAGLE-2's tree", *cats, "**overall**"], rows), "",
            " ".join(_recorded(files[m], d, d["command"].rsplit(" --out", 1)[0]).markdown()
                     for m, d in runs.items()), ""]


def _penalty_loss() -> list[str]:
    """Two short fine-tunes from the same head, alike but for the repetition penalty in the loss (runs.json
    heads.PENALTY_LOSS): the development set's τ of each, greedy and under penalty 1.2."""
    if "PENALTY_LOSS" not in DATA:
        return []
    run = DATA["PENALTY_LOSS"]
    d, start = run["DIR"], run["START"]
    arms = {"control": "the same run without it", "penalty": "`--penalty-loss --penalty-share 0.5`"}
    t = {a: load(f"{d}/training-{a}.json") for a in arms}
    rows = [[f"{run['NAME']} (start)", "0", "–", *(num(_tau(f"{start}/tau-dev-new-p{p_}.json")) for p_ in PENALTIES)]]
    rows += [[label, f"{t[a]['trained_positions']:,}", f"{t[a]['train_positions_per_s']:,.0f}",
              *(num(_tau(f"{d}/tau-dev-{a}-p{p_}.json")) for p_ in PENALTIES)] for a, label in arms.items()]
    taus = [load(f"{d}/tau-dev-{a}-p{p_}.json") for a in arms for p_ in PENALTIES]
    one = taus[-1]
    c = t["penalty"]

    def gain(p_: str) -> float:
        return _tau(f"{d}/tau-dev-penalty-p{p_}.json") - _tau(f"{d}/tau-dev-control-p{p_}.json")

    return ["### The repetition penalty in the loss (not shipped)", "",
            f"Two fine-tunes of {c['config']['epochs']:g} epochs from {run['NAME']} over its data, alike but for "
            "`--penalty-loss` (draft and target compared after HF's repetition penalty over each sequence's "
            "history: the answers decoded under penalty 1.2 and, by `--penalty-share 0.5`, "
            f"{c['penalty_assigned']:,} of the other sequences under 1.2 too; {c['penalised_sequences']:,} of "
            f"{c['sequences']:,} in all). τ of a chain of 6 on the development set, 128 tokens, packed weights:", "",
            table(["head", "positions trained", "positions/s", *(f"dev: {v}" for v in PENALTIES.values())], rows),
            "", _recorded(f"{d}/training-*.json", c, c["command"].split(" --")[0] + " …").markdown(),
            _recorded(f"{d}/tau-*.json", one, one["command"].replace(one["head"], "HEAD").rsplit(" --out", 1)[0])
            .markdown(), "",
            f"- Every generation equals the target's own greedy output ({sum(x['mismatches'] for x in taus)} "
            "mismatches).",
            f"- Against the control, the penalty in the loss moved τ by {gain('1.2'):+.2f} under the penalty and "
            f"{gain('1.0'):+.2f} greedy (one run of each: within noise under the penalty), so no head ships trained "
            "that way.", ""]


def _latest() -> list[dict]:
    """The last fine-tune of each model in CPU_HEADS (the shipped heads), in the order of their models' first."""
    last: dict[str, dict] = {}
    for run in CPU_HEADS:
        last[run.get("MODEL", "Gemma")] = run
    return list(last.values())


def render() -> str:
    latest = [line for run in _latest() for line in _cpu_fine_tune(run)]
    return "\n".join(["## The shipped draft heads", "",
                      "The EAGLE-1/2 heads in `src/microspec/heads/<model>/` (one decoder layer and fc over the "
                      "target's features, the target's own LM head), measured with `benchmarks/measure/eagle_tau.py`.",
                      "", *(latest or _cpu_trained()), *_eagle2_tau(),
                      "The earlier heads (τ by category of fine-tune 4 of Gemma's head and of SmolLM2's head before "
                      "fine-tune 1, Gemma's τ by language, the fine-tunes since) and the heads trained and not "
                      "shipped: [docs/history.md](docs/history.md#the-draft-heads-earlier-and-not-shipped).", "",
                      *_training()]).rstrip() + "\n"


def history() -> str:
    shipped = _latest()
    earlier = [*_cpu_trained(), *(line for run in CPU_HEADS if run not in shipped
                                  for line in _cpu_fine_tune(run))] if CPU_HEADS else []
    return "\n".join(["## The draft heads: earlier, and not shipped", "",
                      "The fine-tunes shipped before the current heads, the τ of fine-tune 4 of Gemma's head (and of "
                      "SmolLM2's head before fine-tune 1) by category and by language, then the heads trained and not "
                      "shipped.", "", *earlier, *_by_category(), *_by_language(),
                      *_penalty_loss(), *_pilot(), *_gpu_heads(), *_eagle1_h200()]).rstrip() + "\n"


FIGURES: dict = {}
