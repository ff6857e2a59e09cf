// Package demo embeds kiln's own demo model, so that `kiln run` works on a
// fresh machine with no network: a 5.2M-parameter Llama with a 4096-token
// byte-level BPE vocabulary, trained by tools/demo-model on the King James
// Bible (public domain). files/MODEL_CARD.md describes it.
package demo

import (
	"embed"
	"io/fs"

	"kiln/model"
	"kiln/tokenizer"
)

//go:embed files
var files embed.FS

// Name identifies the embedded model in messages.
const Name = "kiln demo model (5.2M-parameter Llama trained on the King James Bible)"

// FS returns the model's Hugging Face directory.
func FS() fs.FS {
	sub, err := fs.Sub(files, "files")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return sub
}

// Load returns the embedded model and its tokenizer.
func Load() (*model.Model, *tokenizer.Tokenizer, error) {
	m, err := model.LoadHFFS(FS(), "demo")
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.LoadFS(FS(), "demo")
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, tok, nil
}
