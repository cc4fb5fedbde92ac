// The tested blocks of the README and of docs/*.md: each is marked by an
// HTML comment `<!-- readme-test: NAME ... -->` (README) or
// `<!-- doc-test: NAME ... -->` (docs) just above its fence, so that the
// tests run the documents' own text, not a copy of it.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";

/**
 * The repository root: the first directory above this file that holds
 * deno.json and README.md (tests/ in a clone; npm/scratch/tests-esm/ when
 * the npm build's compiled tests run inside the clone).
 */
export const root: string = (() => {
  let dir = new URL(".", import.meta.url).pathname;
  for (;;) {
    const up = dirname(dir.replace(/\/$/, ""));
    if (
      existsSync(join(up, "deno.json")) && existsSync(join(up, "README.md"))
    ) {
      return up;
    }
    if (up === dir || up === "/") {
      return join(new URL(".", import.meta.url).pathname, "..");
    }
    dir = up;
  }
})();

/** A fenced block of a document: its info string, its text and its marker. */
export interface Block {
  lang: string;
  text: string;
}

/** A fenced block as it stands in a document, with the marker above it. */
export interface DocBlock extends Block {
  file: string;
  line: number;
  marker: string | undefined;
}

/** README.md and every docs/*.md, relative to the root. */
export function documents(): string[] {
  const docs = existsSync(join(root, "docs"))
    ? readdirSync(join(root, "docs")).filter((f) => f.endsWith(".md")).sort()
      .map((f) => `docs/${f}`)
    : [];
  return ["README.md", ...docs];
}

const FENCE = /^( *)```/;

/** Every fenced block of `file`, with the marker just above it, if any. */
export function blocks(file: string): DocBlock[] {
  const lines = readFileSync(join(root, file), "utf8").split("\n");
  const out: DocBlock[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = lines[i].match(FENCE);
    if (!open) continue;
    const indent = open[1].length;
    const lang = lines[i].slice(indent + 3).trim();
    let j = i + 1;
    while (j < lines.length && !FENCE.test(lines[j])) j++;
    const text = lines.slice(i + 1, j).map((l) => l.slice(indent)).join("\n") +
      "\n";
    let k = i - 1;
    while (k >= 0 && lines[k].trim() === "") k--;
    const m = k >= 0
      ? lines[k].match(/<!-- (?:readme|doc)-test: ([a-z0-9-]+)/)
      : null;
    out.push({ file, line: i + 1, lang, text, marker: m?.[1] });
    i = j;
  }
  return out;
}

/** The block marked `name` in `file` (the README by default). */
export function readmeBlock(name: string, file = "README.md"): Block {
  const block = blocks(file).find((b) => b.marker === name);
  if (!block) throw new Error(`${file} has no block marked ${name}`);
  return { lang: block.lang.split(/\s/)[0], text: block.text };
}

/** The block marked `name` in docs/`file`. */
export function docBlock(file: string, name: string): Block {
  return readmeBlock(name, `docs/${file}`);
}

/** The command lines of a shell block (comment lines and blanks left out). */
export function commandLines(block: Block): string[] {
  return block.text.split("\n").filter((l) =>
    l.trim() !== "" && !l.trim().startsWith("#")
  );
}
