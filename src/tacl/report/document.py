"""The report as a list of blocks (headings, paragraphs, tables, figures), written as Markdown
(`report.md`) and as one self-contained HTML page (`report.html`, figures embedded), so that the page can
be copied off a cluster and opened anywhere. Neither holds a time or a host name: the same runs give the
same bytes."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tacl.runtime.io import atomic_path

STYLE = ("body{font-family:sans-serif;max-width:75em;margin:2em auto;padding:0 1em;line-height:1.4}"
         "table{border-collapse:collapse;font-size:90%;margin:0.5em 0}th,td{border:1px solid #ccc;"
         "padding:2px 6px;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
         "figcaption{font-size:90%;color:#444}code{background:#f3f3f3}")


def table_text(df: pd.DataFrame) -> pd.DataFrame:
    """The table as shown: '-' wherever a number does not exist (a layer a model does not have, a missing
    run), never `nan`."""
    return df.astype(object).where(df.notna(), "-")


def markdown(df: pd.DataFrame) -> str:
    return table_text(df).to_markdown(index=False, disable_numparse=True) if not df.empty else "(nothing yet)"


def save_png(fig: Any, out_png: str | Path, dpi: int = 120) -> None:
    """A matplotlib figure as PNG (atomically), cut to what it holds (a legend beside the axes included), then
    closed."""
    import matplotlib.pyplot as plt

    with atomic_path(out_png) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)


def _inline(text: str) -> str:
    """Markdown's inline code (`x`) as HTML, the rest escaped."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


@dataclass
class Document:
    blocks: list[tuple] = field(default_factory=list)

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", level, text))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def table(self, df: pd.DataFrame) -> None:
        self.blocks.append(("table", df))

    def figure(self, alt: str, path: str | Path, caption: str | None = None) -> None:
        """A PNG beside report.md (Markdown names it by its file name; the HTML page embeds it)."""
        self.blocks.append(("figure", alt, Path(path), caption))

    def markdown(self) -> str:
        lines = []
        for kind, *rest in self.blocks:
            if kind == "heading":
                lines += ["#" * rest[0] + " " + rest[1], ""]
            elif kind == "paragraph":
                lines += [rest[0], ""]
            elif kind == "table":
                lines += [markdown(rest[0]), ""]
            else:
                alt, file, caption = rest
                lines += [f"![{alt}]({file.name})", ""] + ([caption, ""] if caption else [])
        return "\n".join(lines)

    def html(self) -> str:
        """One page, each figure embedded as a data URI."""
        title = next((b[2] for b in self.blocks if b[0] == "heading" and b[1] == 1), "Results")
        out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
               f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"]
        for kind, *rest in self.blocks:
            if kind == "heading":
                out.append(f"<h{rest[0]}>{_inline(rest[1])}</h{rest[0]}>")
            elif kind == "paragraph":
                out.append(f"<p>{_inline(rest[0])}</p>")
            elif kind == "table":
                df = rest[0]
                out.append(table_text(df).to_html(index=False, border=0) if not df.empty else "<p>(nothing yet)</p>")
            else:
                alt, file, caption = rest
                data = base64.b64encode(file.read_bytes()).decode()
                out.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'
                           + (f"<figcaption>{_inline(caption)}</figcaption>" if caption else "") + "</figure>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"
