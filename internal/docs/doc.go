// Package docs keeps the repository's documentation true to its code. It has no code
// of its own; its tests check README.md and docs/:
//
//   - every Go name a doc cites in a code span (`pkg.Func`, `Type.Method`, `Func()`,
//     `TestName`) is declared in this module;
//   - every link stays in the repository and lands on a file, and on a heading when it
//     names one;
//   - every `docs/<page>.md, "<Section>"` a comment or a doc cites is a heading of that
//     page.
//
// They read files only (no services), so they run in a fraction of a second.
package docs
