/**
 * A directory pinned by a path, its entries named `${prefix}/${name}`, for
 * Deno's ops and `node:fs` (each a {@linkcode PathCalls}).
 *
 * @module
 */

import type { Dir, FileInfo, Handle } from "./types.ts";

/** A runtime's calls by whole path, with {@linkcode Dir}'s answers. */
export interface PathCalls {
  /** Creates `path` (`O_EXCL`), mode 0644. */
  create(path: string): Handle | "EEXIST" | "ENOENT";
  /** {@linkcode Platform.openExisting}. */
  open(path: string): Handle | "ENOENT";
  /** `link(2)` of `from` to `to`, both in `dir`. */
  link(from: string, to: string, dir: string): "EEXIST" | "ENOENT" | undefined;
  /** `unlink(2)` of `path`, in `dir`. */
  unlink(path: string, dir: string): "ENOENT" | undefined;
  /** `lstat(2)`, or `null` when the path does not exist. */
  lstat(path: string): FileInfo | null;
  /** Closes a directory's descriptor. Never throws. */
  close?(fd: number): void;
}

/** Named by its canonical path, or `/proc/self/fd/N` while `fd` holds it. */
export class PathDir implements Dir {
  readonly prefix: string;
  readonly byDescriptor: boolean;
  #calls: PathCalls;
  #fd: number | undefined;

  constructor(calls: PathCalls, prefix: string, fd?: number) {
    this.#calls = calls;
    this.prefix = prefix;
    this.byDescriptor = fd !== undefined;
    this.#fd = fd;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    return this.#calls.create(`${this.prefix}/${name}`);
  }

  open(name: string): Handle | "ENOENT" {
    return this.#calls.open(`${this.prefix}/${name}`);
  }

  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined {
    const p = this.prefix;
    return this.#calls.link(`${p}/${existing}`, `${p}/${created}`, p);
  }

  unlink(name: string): "ENOENT" | undefined {
    return this.#calls.unlink(`${this.prefix}/${name}`, this.prefix);
  }

  lstat(name: string): FileInfo | null {
    return this.#calls.lstat(`${this.prefix}/${name}`);
  }

  close(): void {
    const fd = this.#fd;
    this.#fd = undefined;
    if (fd !== undefined) this.#calls.close?.(fd);
  }
}
