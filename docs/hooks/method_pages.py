"""mkdocs hook: one page per registered method, generated at build time from the method's class.

The methods overview gets a table linking them all. Each page has the method's paper, equations, family and cost, a table of its hyper-parameters (name,
default, help) and the module's documentation rendered by mkdocstrings. Nothing is written into docs/.
"""

from __future__ import annotations

from mkdocs.structure.files import File, Files


def _page(name: str) -> str:
    from mtlflow import methods

    cls, info = methods.get(name), methods.info(name)
    rows = "\n".join(f"| `{key}` | `{default!r}` | {help_text.replace('|', '/')} |"
                     for key, (default, help_text) in info.hparams.items())
    table = ("| hyper-parameter | default | meaning |\n|---|---|---|\n" + rows) if rows else "No hyper-parameters."
    return (f"# {name}\n\n"
            f"- **Paper:** {info.paper}\n- **Equations:** {info.equations}\n"
            f"- **Family:** {info.family}; **cost per step:** {info.cost}; "
            f"**needs:** {cls.requires.value}\n\n"
            f"Train it with `mtlflow train --method {name} --hp NAME=VALUE ...`.\n\n"
            f"## Hyper-parameters\n\n{table}\n\n## Implementation\n\n::: {cls.__module__}\n")


def on_files(files: Files, config) -> Files:
    from mtlflow import methods

    for name in methods.available():
        files.append(File.generated(config, f"methods/{name}.md", content=_page(name)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """The methods overview starts with a table linking every method's page."""
    if page.file.src_uri != "methods/index.md":
        return markdown
    from mtlflow import methods

    rows = "\n".join(f"| [{name}]({name}.md) | {methods.info(name).family} | {methods.info(name).cost} | "
                     f"{methods.info(name).paper} |" for name in methods.available())
    table = "| method | family | cost | paper |\n|---|---|---|---|\n" + rows
    title, _, rest = markdown.partition("\n")
    return f"{title}\n\n{table}\n{rest}"
