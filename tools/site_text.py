"""What the web book changes in its copies of the chapters (``tools/website.py``).

The committed notebooks are rendered as they are, except in the copies Sphinx reads
(``build/site-src``), where:

* a check table printed by :class:`llmbook.nbtools.Checks` becomes an HTML table that fits
  the text column (pass mark first, cells that wrap), with a check name that the
  fixed-width table cut at 48 characters restored from the cell's source when one string
  literal there starts with it (:func:`checks_to_html`);
* a paper named in the text, "Vaswani et al. (2017)" or "(Kaplan et al., 2020)", becomes a
  citation of its ``references.bib`` entry (:func:`cite_papers`, :data:`CITATIONS`);
* a displayed formula the text refers back to gets a number and the reference a link
  (:data:`EQUATION_REFS`);
* a box under the chapter's opening links its notebook, its solutions and the
  repository, and says how to run it (:func:`chapter_box`).
"""

from __future__ import annotations

import ast
import html
import re
from typing import Any

import nbformat

_TITLE = re.compile(r"^(?P<title>.*): (?P<ok>\d+)/(?P<all>\d+) passed$")
_HEADER = re.compile(r"^check +expected +got +pass +error$")
_RULE = re.compile(r"^-+(?: +-+){4}$")


def _string_literals(source: str) -> list[str | re.Pattern[str]]:
    """The string literals of a cell's source: plain ones as strings, f-strings as patterns
    (a replacement field matches anything). A source that does not parse has none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[str | re.Pattern[str]] = []
    inside = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else "(?:.+?)"
                     for v in node.values]
            out.append(re.compile("".join(parts), flags=re.S))
    return out


def _complete(prefix: str, literal: str | re.Pattern[str]) -> str | None:
    """``literal`` as the text that starts with ``prefix``, if it can be known.

    An f-string is known when ``prefix`` runs past its last replacement field: what is
    left is its literal tail."""
    if isinstance(literal, str):
        return literal if literal.startswith(prefix) and len(literal) > len(prefix) else None
    pattern = literal.pattern
    last = pattern.rfind("(?:.+?)")
    if last < 0:
        return None
    head, tail = re.compile(pattern[:last + 7], flags=re.S), re.sub(r"\\(.)", r"\1", pattern[last + 7:])
    for j in range(1, len(prefix) + 1):  # the shortest value of the last field
        if tail.startswith(prefix[j:]) and len(prefix) - j < len(tail) and head.fullmatch(prefix[:j]):
            return prefix[:j] + tail
    return None


def restore_name(cut: str, literals: list[str | re.Pattern[str]]) -> str:
    """The full check name for ``cut`` (ending in "…") if exactly one literal completes it."""
    if not cut.endswith("…"):
        return cut
    found = {full for lit in literals if (full := _complete(cut[:-1], lit)) is not None}
    return found.pop() if len(found) == 1 else cut


def _split_row(line: str, spans: list[tuple[int, int]]) -> list[str]:
    cells = [line[a:b].strip() for a, b in spans[:-1]]
    return [*cells, line[spans[-1][0]:].strip()]


def _table_html(title: str, n_ok: int, n_all: int, rows: list[list[str]], literals: list[str]) -> str:
    out = [f'<table class="llmbook-checks"><caption>{html.escape(title)}: {n_ok}/{n_all} passed'
           "</caption>", "<thead><tr><th>pass</th><th>check</th><th>expected</th><th>got</th>"
           "<th>error</th></tr></thead><tbody>"]
    for what, expected, got, ok, err in rows:
        mark = '<td class="ok">✓</td>' if ok == "yes" else '<td class="failed">✗</td>'
        cells = "".join(f'<td class="value">{html.escape(v)}</td>' for v in (expected, got, err))
        out.append(f"<tr>{mark}<td>{html.escape(restore_name(what, literals))}</td>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def checks_to_html(text: str, source: str = "") -> str | None:
    """``text`` (a cell's printed output) as HTML with its check tables as tables, or None.

    Lines that are not part of a check table stay as they were, in wrapping pre-formatted
    blocks. ``source`` is the cell's code, where cut check names are looked up.
    """
    lines = text.split("\n")
    literals = _string_literals(source)
    parts: list[str] = []
    plain: list[str] = []
    found = False
    i = 0
    while i < len(lines):
        m = _TITLE.match(lines[i])
        if m and i + 2 < len(lines) and _HEADER.match(lines[i + 1]) and _RULE.match(lines[i + 2]):
            spans = [(x.start(), x.end() + 2) for x in re.finditer(r"-+", lines[i + 2])]
            rows, i = [], i + 3
            while i < len(lines) and len(row := _split_row(lines[i], spans)) == 5 \
                    and row[3] in ("yes", "NO"):  # a row has its pass mark; the table ends
                rows.append(row)
                i += 1
            if plain:
                parts.append(_pre("\n".join(plain)))
                plain = []
            parts.append(_table_html(m["title"], int(m["ok"]), int(m["all"]), rows, literals))
            found = True
            continue
        plain.append(lines[i])
        i += 1
    if not found:
        return None
    rest = "\n".join(plain).strip("\n")
    if rest:
        parts.append(_pre(rest))
    return "\n".join(parts)


def _pre(text: str) -> str:
    return f'<pre class="llmbook-output-text">{html.escape(text)}</pre>'


def tabulate_checks(nb: nbformat.NotebookNode) -> int:
    """Turn the check tables of ``nb``'s stream outputs into HTML in place; return how many."""
    n = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text = out.get("text", "")
                text = "".join(text) if isinstance(text, list) else text
                converted = checks_to_html(text, cell.source)
                if converted is not None:
                    n += converted.count('class="llmbook-checks"')
                    out = nbformat.v4.new_output("display_data",
                                                 data={"text/html": converted, "text/plain": text})
            outputs.append(out)
        cell.outputs = outputs
    return n


# ---------------------------------------------------------------- long formulas

#: A formula a notebook displayed (SymPy's LaTeX) longer than this many characters of TeX
#: is set one term per line (:func:`break_formula`).
LONG_TEX = 300


def _top_level(tex: str) -> list[tuple[int, str]]:
    """(position, "+"/"-"/"=") of the operators of ``tex`` outside braces and \\left..\\right."""
    out, depth, i = [], 0, 0
    while i < len(tex):
        if tex.startswith("\\left", i) and not tex[i + 5:i + 6].isalpha():  # not \leftarrow
            depth, i = depth + 1, i + 5
            continue
        if tex.startswith("\\right", i) and not tex[i + 6:i + 7].isalpha():
            depth, i = depth - 1, i + 6
            continue
        c = tex[i]
        depth += (c == "{") - (c == "}")
        if depth == 0 and c in "+-=" and tex[i - 1:i] == " " and tex[i + 1:i + 2] == " ":
            out.append((i, c))
        i += 1
    return out


def break_formula(tex: str) -> str:
    """``tex`` ("$\\displaystyle lhs = a + b - c$") with each term of its right-hand side on a
    line of its own, aligned after the "=", if it is longer than :data:`LONG_TEX`."""
    m = re.fullmatch(r"\$(\\displaystyle\s*)?(.*)\$", tex.strip(), flags=re.S)
    if not m or len(tex) <= LONG_TEX:
        return tex
    body = m.group(2)
    ops = _top_level(body)
    eq = next((i for i, c in ops if c == "="), None)
    cuts = [i for i, c in ops if c in "+-" and (eq is None or i > eq)]
    if not cuts:
        return tex
    lines, start = [], (eq + 1 if eq is not None else 0)
    for i in cuts:
        lines.append(body[start:i].strip())
        start = i
    lines.append(body[start:].strip())
    lhs = body[:eq].strip() + " = {}" if eq is not None else ""
    return ("$\\displaystyle \\begin{aligned} " + lhs + " & " + " \\\\ & ".join(lines)
            + " \\end{aligned}$")


def break_long_formulas(nb: nbformat.NotebookNode) -> int:
    """Set the long displayed formulas of ``nb``'s outputs one term per line; return how many."""
    n = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/latex" in data:
                tex = data["text/latex"]
                tex = "".join(tex) if isinstance(tex, list) else tex
                broken = break_formula(tex)
                if broken != tex:
                    data["text/latex"] = broken
                    n += 1
    return n


# ---------------------------------------------------------------- citations

#: How the chapters name a paper ("Surname", "Surname & Surname", "Surname et al." and
#: longer lists, then the year) -> its key in ``references.bib``. Where two papers share a
#: name and a year, :data:`CHAPTER_CITATIONS` says which one a chapter means.
CITATIONS: dict[str, str] = {
    "Abramowitz & Stegun 1964": "abramowitz1964", "Aghajanyan et al. 2020": "aghajanyan2020",
    "Ainslie et al. 2023": "ainslie2023", "Allal et al. 2025": "allal2025",
    "Azar et al. 2023": "azar2023", "Ba, Kiros & Hinton 2016": "ba2016",
    "Beltagy, Peters & Cohan 2020": "beltagy2020", "Besiroglu et al. 2024": "besiroglu2024",
    "BigScience 2022": "bigscience2022", "Blelloch 1990": "blelloch1990",
    "Bradley & Terry 1952": "bradley1952", "Brown et al. 2020": "brown2020",
    "Chen et al. 2016": "chen2016", "Chen et al. 2021": "chen2021",
    "Chowdhery et al. 2022": "chowdhery2022", "Cover & Thomas 2006": "cover2006",
    "Dai et al. 2024": "dai2024", "Dao et al. 2022": "dao2022", "Dao 2023": "dao2023",
    "DeepSeek-AI 2025": "deepseek2025r1", "Dettmers et al. 2022": "dettmers2022",
    "Dettmers et al. 2023": "dettmers2023", "Devlin et al. 2019": "devlin2019",
    "Dubey et al. 2024": "dubey2024", "Elhage et al. 2021": "elhage2021",
    "Elhoushi et al. 2024": "elhoushi2024", "Fan, Lewis & Dauphin 2018": "fan2018",
    "Fedus, Zoph & Shazeer 2021": "fedus2021", "Frantar et al. 2023": "frantar2023",
    "Gage 1994": "gage1994", "Gale et al. 2022": "gale2022", "Gao et al. 2023": "gao2023",
    "Goyal et al. 2017": "goyal2017", "Griewank & Walther 2008": "griewank2008",
    "Gu, Goel & Ré 2021": "gu2021", "Gu & Dao 2023": "gu2023", "Harris 1954": "harris1954",
    "Hassibi & Stork 1993": "hassibi1993", "Haviv et al. 2022": "haviv2022",
    "He et al. 2016": "he2016", "Hendrycks & Gimpel 2016": "hendrycks2016",
    "Hillis & Steele 1986": "hillis1986", "Hoffmann et al. 2022": "hoffmann2022",
    "Holtzman et al. 2020": "holtzman2020", "Hu et al. 2021": "hu2021",
    "Huang et al. 2019": "huang2019", "Jiang et al. 2023": "jiang2023",
    "Jiang et al. 2024": "jiang2024", "Kaplan et al. 2020": "kaplan2020",
    "Katharopoulos et al. 2020": "katharopoulos2020",
    "Katharopoulos, Vyas, Pappas & Fleuret 2020": "katharopoulos2020",
    "Kingma & Ba 2015": "kingma2015", "Korthikanti et al. 2022": "korthikanti2022",
    "Krell et al. 2021": "krell2021", "Kudo 2018": "kudo2018",
    "Kudo & Richardson 2018": "kudo2018sentencepiece", "Lepikhin et al. 2020": "lepikhin2020",
    "Leviathan et al. 2023": "leviathan2023", "Leviathan, Kalman & Matias 2023": "leviathan2023",
    "Li et al. 2020": "li2020", "Lin et al. 2024": "lin2024", "Liu et al. 2025": "liu2025",
    "Loshchilov & Hutter 2017": "loshchilov2017", "Loshchilov & Hutter 2019": "loshchilov2019",
    "Meister et al. 2023": "meister2023", "Micikevicius et al. 2018": "micikevicius2018",
    "Milakov & Gimelshein 2018": "milakov2018", "NVIDIA 2023": "nvidia2023",
    "Narayanan et al. 2021": "narayanan2021", "Nguyen et al. 2024": "nguyen2024",
    "Olsson et al. 2022": "olsson2022", "Ouyang et al. 2022": "ouyang2022",
    "Pal et al. 2024": "pal2024", "Pascanu et al. 2013": "pascanu2013",
    "Patarasuk & Yuan 2009": "patarasuk2009", "Pearce & Song 2024": "pearce2024",
    "Polyak 1964": "polyak1964", "Porian et al. 2024": "porian2024",
    "Press & Wolf 2017": "press2017", "Press et al. 2022": "press2022",
    "Press, Smith & Lewis 2022": "press2022", "Radford et al. 2018": "radford2018",
    "Radford et al. 2019": "radford2019", "Rafailov et al. 2023": "rafailov2023",
    "Rajbhandari et al. 2020": "rajbhandari2020", "Rosenbrock 1960": "rosenbrock1960",
    "Rumelhart, Hinton & Williams 1986": "rumelhart1986", "Schulman et al. 2016": "schulman2016",
    "Schulman et al. 2017": "schulman2017", "Schuster & Nakajima 2012": "schuster2012",
    "Sennrich et al. 2016": "sennrich2016", "Shao et al. 2024": "shao2024",
    "Shazeer 2019": "shazeer2019", "Shazeer 2020": "shazeer2020",
    "Shazeer et al. 2017": "shazeer2017", "Shoeybi et al. 2019": "shoeybi2019",
    "Su et al. 2021": "su2021", "Sun et al. 2023": "sun2023",
    "Sutskever et al. 2013": "sutskever2013", "Thakur et al. 2005": "thakur2005",
    "Thakur, Rabenseifner & Gropp 2005": "thakur2005", "Tieleman & Hinton 2012": "tieleman2012",
    "Tillet et al. 2019": "tillet2019", "Vaswani et al. 2017": "vaswani2017",
    "Wang et al. 2023": "wang2023", "Wang et al. 2024": "wang2024",
    "Welleck et al. 2020": "welleck2020", "Williams 1992": "williams1992",
    "Williams, Waterman & Patterson 2009": "williams2009",
    "Wilson & Hilferty 1931": "wilson1931", "Wu et al. 2016": "wu2016",
    "Xiao et al. 2023": "xiao2023", "Xiong et al. 2020": "xiong2020", "Xu et al. 2022": "xu2022",
    "Xu et al. 2024": "xu2024", "Yang et al. 2024": "yang2024", "Yu et al. 2025": "yu2025",
    "Yue et al. 2025": "yue2025", "Zhang & Sennrich 2019": "zhang2019",
    "Zhang et al. 2024": "zhang2024", "Zhao et al. 2023": "zhao2023",
    "Ziegler et al. 2019": "ziegler2019", "Zoph et al. 2022": "zoph2022",
    # the chapters on batch size, data and multi-token prediction (10b-10d, 12b) and
    # emergence (11)
    "Anil et al. 2023": "anil2023", "Broder 1997": "broder1997",
    "Gao et al. 2020": "gao2020pile", "Gloeckle et al. 2024": "gloeckle2024",
    "Indyk & Motwani 1998": "indyk1998", "Lee et al. 2022": "lee2022",
    "McCandlish et al. 2018": "mccandlish2018", "Rae et al. 2021": "rae2021",
    "Schaeffer et al. 2023": "schaeffer2023", "Schaeffer, Miranda & Koyejo 2023": "schaeffer2023",
    "Stern, Shazeer & Uszkoreit 2018": "stern2018",
    "Stern et al. 2018": "stern2018",
    "Touvron et al. 2023a": "touvron2023llama", "Touvron et al. 2023b": "touvron2023llama2",
    "Wei et al. 2022": "wei2022emergent", "Wenzek et al. 2020": "wenzek2020",
    "Ye et al. 2024": "ye2024mixing", "Zhang et al. 2022": "zhang2022opt",
    # Part V's third edition (issue 24)
    "Ahmadian et al. 2024": "ahmadian2024", "Ethayarajh et al. 2024": "ethayarajh2024",
    "Hong et al. 2024": "hong2024", "Meng et al. 2024": "meng2024",
    "Hayou, Ghosh & Yu 2024": "hayou2024", "Hayou et al. 2024": "hayou2024",
    "Kalajdzievski 2023": "kalajdzievski2023", "Liu et al. 2024": "liu2024dora",
    "Cobbe et al. 2021": "cobbe2021", "Zheng et al. 2025": "zheng2025",
    "Stiennon et al. 2020": "stiennon2020", "Nakano et al. 2021": "nakano2021",
    "Beirami et al. 2024": "beirami2024",
    "Bai et al. 2022": "bai2022constitutional", "Lee et al. 2023": "lee2023rlaif",
    "Zheng et al. 2023": "zheng2023judge",
    # Part VI's third edition (issue 25): chapter 22b, context parallelism
    "Liu et al. 2023": "liu2023ring", "Jacobs et al. 2023": "jacobs2023",
    "Brandon et al. 2023": "brandon2023",
    # chapter 24, in-context learning as gradient descent
    "von Oswald et al. 2023": "vonoswald2023",
    # chapter 23b, Mamba-2 and state-space duality
    "Dao & Gu 2024": "dao2024ssd",
    # chapter 24b, interpretability on the real model
    "Geva et al. 2021": "geva2021", "Meng et al. 2022": "meng2022rome",
    "Xiao et al. 2024": "xiao2024sinks", "Elhage et al. 2022": "elhage2022superposition",
    # issue 27, chapter 13
    "Kwon et al. 2023": "kwon2023",
    # issue 27, chapter 15
    "Micikevicius et al. 2022": "micikevicius2022", "Rouhani et al. 2023": "rouhani2023mx",
    "Ashkboos et al. 2024": "ashkboos2024quarot",
    # issue 27, chapter 11
    "Muennighoff et al. 2023": "muennighoff2023", "Sardana et al. 2024": "sardana2024",
    # issue 27, chapter 07
    "Yang et al. 2025": "yang2025qwen3", "OLMo et al. 2024": "olmo2024olmo2",
    "Kamath et al. 2025": "kamath2025gemma3", "Kazemnejad et al. 2023": "kazemnejad2023nope",
    # issue 27, chapter 04
    "Riviere et al. 2024": "riviere2024gemma2",
    # issue 27 round 2, chapters 04/13
    "OpenAI 2025": "openai2025gptoss",
    # issue 27, chapter 01
    "Land & Bartolo 2024": "land2024magikarp",
    # issue 27, chapter 02
    "Gao et al. 2019": "gao2019degeneration",
    # issue 27, chapter 12
    "Yang et al. 2023": "yang2023reference",
    # issue 27, chapter 14
    "Dao et al. 2023": "dao2023flashdecoding", "Dong et al. 2024": "dong2024flex",
    # issue 27 round 2, chapter 09
    "Jordan et al. 2024": "jordan2024muon", "Shazeer & Stern 2018": "shazeer2018adafactor",
    "Hu et al. 2024": "hu2024minicpm",
    # issue 27 round 2, chapter 12
    "Willard & Louf 2023": "willard2023guided",
}

#: (chapter, name as in :data:`CITATIONS`) -> key, for names two papers share: LLaMA and
#: Llama 2, positional interpolation and speculative sampling, YaRN and RWKV, DeepSeek-V2
#: and -V3. A chapter is named as its file begins: "07", or "10d" for a chapter added
#: after chapter 10 (:func:`chapter_label`).
CHAPTER_CITATIONS: dict[tuple[str, str], str] = {
    **{(ch, "Touvron et al. 2023"): "touvron2023llama" for ch in ("01", "06", "07", "10b", "10d", "16")},
    **{(ch, "Touvron et al. 2023"): "touvron2023llama2"
       for ch in ("02", "11", "13", "15", "17")},
    ("05", "Chen et al. 2023"): "chen2023interpolation",
    ("12", "Chen et al. 2023"): "chen2023speculative",
    ("12b", "Chen et al. 2023"): "chen2023speculative",
    ("09", "Chen et al. 2023"): "chen2023lion",  # issue 27 round 2, chapter 09
    ("05", "Peng et al. 2023"): "peng2023yarn",
    ("23", "Peng et al. 2023"): "peng2023rwkv",
    ("13", "DeepSeek-AI 2024"): "deepseek2024v2",
    ("12b", "DeepSeek-AI 2024"): "deepseek2024v3",
    ("21", "DeepSeek-AI 2024"): "deepseek2024v3",
}


def chapter_label(stem: str) -> str:
    """How chapter ``stem`` is named: "07" for ``07_decoder``, "10d" for ``10d_data_mixtures``."""
    label = stem.split("_", 1)[0]
    if not re.fullmatch(r"\d\d[a-z]?", label):
        raise ValueError(f"{stem!r} is not a chapter name such as 07_decoder or 10d_data_mixtures")
    return label

# a surname, with a lower-case particle where it has one ("von Oswald", "van der Maaten")
_NAME = r"(?:\b(?:von|van|de|der|den|du|le|la)\s+)*[A-Z][\w'\-]+"
_AUTHORS = rf"(?P<authors>{_NAME}(?:,\s+{_NAME})*(?:\s+(?:&|and)\s+{_NAME}|\s+et\s+al\.)?)"
# the year may carry a letter where a chapter cites two papers of one year ("2023a")
_CITATION = re.compile(_AUTHORS + r"(?P<sep>,?\s+\(?)(?P<year>(?:19|20)\d\d[a-z]?)(?=[),;:\s])")


def citation_key(chapter: str, authors: str, year: str) -> str | None:
    """The bibliography key of "authors, year" as chapter ``chapter`` writes it, or None.

    A list that starts with a word that is not an author ("Chinchilla, Kaplan et al.")
    is tried without its first names, one at a time."""
    names = re.sub(r"\s+", " ", authors).replace(" and ", " & ")
    while True:
        name = f"{names} {year}"
        key = CHAPTER_CITATIONS.get((chapter, name), CITATIONS.get(name))
        if key is not None or ", " not in names:
            return key
        names = names.split(", ", 1)[1]


def _outside_math_and_code(text: str) -> list[tuple[bool, str]]:
    """``text`` split into (is prose, piece): math and code are left alone."""
    pieces, pos = [], 0
    for m in re.finditer(r"\$\$.*?\$\$|\$[^$\n]+\$|```.*?```|`[^`\n]+`", text, flags=re.S):
        pieces += [(True, text[pos:m.start()]), (False, m.group(0))]
        pos = m.end()
    return [*pieces, (True, text[pos:])]


def cite_papers(markdown: str, chapter: str, used: set[str] | None = None) -> str:
    """``markdown`` with the year of each paper it names linked to the bibliography.

    "Vaswani et al. (2017)" and "(Vaswani et al., 2017, ...)" keep their words; the year
    becomes ``{cite:year}`` of the entry, which shows the year and links to it. Names with
    no entry are left as they are; math and code are never touched. The keys cited are
    added to ``used``.
    """
    used = set() if used is None else used

    def link(m: re.Match[str]) -> str:
        key = citation_key(chapter, m["authors"], m["year"])
        if key is None:
            return m.group(0)
        used.add(key)
        return f"{m['authors']}{m['sep']}{{cite:year}}`{key}`"

    return "".join(_CITATION.sub(link, piece) if prose else piece
                   for prose, piece in _outside_math_and_code(markdown))


# ---------------------------------------------------------------- equations

#: Displayed formulas the text refers back to: (chapter, a piece of the formula's TeX that
#: finds it, its label, the words that refer back to it, what they become).
EQUATION_REFS: list[tuple[str, str, str, str, str]] = [
    ("10", r"\mathcal L_T^{\min} = ", "window-floor", "equals the formula above",
     "equals the formula above, {eq}`window-floor`,"),
]


def number_equations(nb: nbformat.NotebookNode, chapter: str) -> int:
    """Label the formulas of :data:`EQUATION_REFS` in ``nb`` and link the references back."""
    n = 0
    for ch, tex, label, words, linked in EQUATION_REFS:
        if ch != chapter:
            continue
        for cell in nb.cells:
            if cell.cell_type != "markdown":
                continue
            m = re.search(r"\$\$(?:(?!\$\$).)*?" + re.escape(tex) + r".*?\$\$", cell.source, flags=re.S)
            if m:
                cell.source = cell.source[:m.end()] + f" ({label})" + cell.source[m.end():]
                n += 1
        for cell in nb.cells:
            if cell.cell_type == "markdown" and words in cell.source:
                cell.source = cell.source.replace(words, linked)
    return n


# ---------------------------------------------------------------- the chapter's box

def chapter_box(stem: str, repository: str) -> str:
    """A markdown cell's text: the chapter's notebook, solutions, repository, how to run it.

    The notebook is the committed one, copied into the site's ``notebooks/``; the
    solutions are rendered as ``solutions/<stem>`` and linked on the ``repository`` too.
    """
    solution = f"{repository}/blob/main/notebooks/solutions/{stem}.py"
    number = stem.split("_")[0]
    return f"""```{{admonition}} This chapter's notebook, solutions and how to run it
:class: tip llmbook-chapter-links

<a class="llmbook-notebook" href="notebooks/{stem}.ipynb" download>Download the notebook
({stem}.ipynb)</a> ·
[solutions to the exercises](solutions/{stem}.md)
(<a class="llmbook-solution" href="{solution}">{stem}.py on the repository</a>) ·
<a class="llmbook-repository" href="{repository}">the repository</a>

**How to run this chapter.** From a clone of the repository, `make lab` sets up `.venv`
and opens the chapters in JupyterLab. Or, with the downloaded notebook alone:
`pip install llmbook jupyterlab`, then `jupyter lab {stem}.ipynb` (the chapters that
compare with PyTorch's and Hugging Face's peers need `pip install "llmbook[dev]"`, and
those that read the book's shipped data or models need the clone).

**Grade your answers to the exercises.** `llmbook exercises {number}` writes a stub of the
functions to write into `llmbook-work/`; `llmbook grade {number}` runs the checks the
reference solutions pass on your file, one row per exercise (the README's "Doing the
exercises"). In the notebook, the chapter's last cell grades the functions you define there.
```"""


def prepare_chapter(nb: nbformat.NotebookNode, stem: str, repository: str,
                    used: set[str]) -> dict[str, Any]:
    """Apply every change above to the copy ``nb`` of chapter ``stem``; return counts."""
    chapter = chapter_label(stem)
    tables = tabulate_checks(nb)
    formulas = break_long_formulas(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = cite_papers(cell.source, chapter, used)
    equations = number_equations(nb, chapter)
    first = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), 0)
    nb.cells.insert(first + 1, nbformat.v4.new_markdown_cell(chapter_box(stem, repository)))
    return {"check_tables": tables, "long_formulas": formulas, "equations": equations}
