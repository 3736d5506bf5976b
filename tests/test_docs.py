"""README.md and docs/*.md: every relative link and #anchor resolves, and the README stays a front
page."""
import glob
import os.path as osp
import re

import pytest

REPO = osp.abspath(osp.join(osp.dirname(__file__), '..'))
PAGES = [osp.join(REPO, 'README.md')] + sorted(glob.glob(osp.join(REPO, 'docs', '*.md')))
README_MAX_LINES = 260

FENCE = re.compile(r'^\s*(```|~~~)')
INLINE_CODE = re.compile(r'`[^`]*`')
LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def outside_fences(text: str) -> list[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    lines, in_fence = [], False
    for line in text.split('\n'):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link in a heading anchors by its text
    text = re.sub(r'[^\w\- ]', '', text.replace('`', '').lower())
    return text.replace(' ', '-')


def anchors(path: str) -> set[str]:
    """Every #anchor GitHub makes for the headings of a Markdown file (repeats get -1, -2, ...)."""
    with open(path, encoding='utf-8') as f:
        found, seen = set(), {}
        for line in outside_fences(f.read()):
            match = HEADING.match(line)
            if match:
                base = slug(match.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f'{base}-{n}')
    return found


def relative_links(path: str) -> list[str]:
    """The link and image targets of a Markdown file that point inside the repository."""
    with open(path, encoding='utf-8') as f:
        # inline code is text, not links
        targets = [m.group(1) for line in outside_fences(f.read())
                   for m in LINK.finditer(INLINE_CODE.sub('', line))]
    return [t for t in targets if not re.match(r'^[a-z][a-z0-9+.-]*:', t, re.IGNORECASE)]


def test_pages_found():
    """The README and the docs pages it points to are there to check."""
    assert len(PAGES) > 1 and osp.exists(PAGES[0])


def broken_links(page: str) -> list[str]:
    """The relative links of a Markdown file naming a missing file or a missing #anchor, each with why."""
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(osp.dirname(page), file_part)) if file_part else page
        if not osp.exists(resolved):
            broken.append(f'{target}: no such file')
        elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
            broken.append(f'{target}: no heading with this anchor')
    return broken


@pytest.mark.parametrize('page', PAGES, ids=lambda p: osp.relpath(p, REPO))
def test_links_resolve(page: str):
    """Every relative link names an existing file, and every #anchor a heading of that file."""
    broken = broken_links(page)
    assert not broken, f'{osp.relpath(page, REPO)}: ' + '; '.join(broken)


def test_readme_is_a_front_page():
    """The README stays short: the details live in docs/."""
    with open(PAGES[0], encoding='utf-8') as f:
        n_lines = len(f.read().rstrip('\n').split('\n'))
    assert n_lines <= README_MAX_LINES, f'README.md has {n_lines} lines, at most {README_MAX_LINES}'


def test_checker_finds_broken_links(tmp_path):
    """The checker itself sees a missing file and a missing anchor, and ignores code."""
    (tmp_path / 'other.md').write_text('# A title, with `code`\n\n## Twice\n\n## Twice\n')
    page = tmp_path / 'page.md'
    page.write_text('[ok](other.md#a-title-with-code) [ok](other.md#twice-1) [ok](#here)\n'
                    '# Here\n`[code](gone.md)`\n```\n[block](gone.md)\n```\n'
                    '[web](https://example.org/x.md) [bad](gone.md) [bad](other.md#nowhere)\n')
    targets = relative_links(str(page))
    assert targets == ['other.md#a-title-with-code', 'other.md#twice-1', '#here', 'gone.md',
                       'other.md#nowhere']
    assert anchors(str(tmp_path / 'other.md')) == {'a-title-with-code', 'twice', 'twice-1'}
    assert broken_links(str(page)) == ['gone.md: no such file',
                                       'other.md#nowhere: no heading with this anchor']
