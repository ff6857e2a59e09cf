package tokenizer

// Loading Hugging Face tokenizer.json. The file describes a pipeline
// (normalizer, pre_tokenizer, model, post_processor, decoder) as nested
// tagged JSON objects; each part is mapped onto the Tokenizer's fixed
// pipeline, and anything kiln cannot reproduce exactly is an error rather
// than a silent mismatch. Loading a directory also reads tokenizer_config.json
// (bos/eos tokens, chat template), chat_template.jinja and
// generation_config.json (extra eos ids) when present.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
)

type hfFile struct {
	AddedTokens   []hfAddedToken  `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         hfModel         `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
}

type hfAddedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type hfModel struct {
	Type         string          `json:"type"`
	Vocab        map[string]int  `json:"vocab"`
	Merges       json.RawMessage `json:"merges"`
	UnkToken     *string         `json:"unk_token"`
	FuseUnk      bool            `json:"fuse_unk"`
	ByteFallback bool            `json:"byte_fallback"`
	IgnoreMerges bool            `json:"ignore_merges"`
	Prefix       *string         `json:"continuing_subword_prefix"`
	Suffix       *string         `json:"end_of_word_suffix"`
	Dropout      *float64        `json:"dropout"`
}

// hfNode is any tagged part of the pipeline; only the fields kiln uses.
type hfNode struct {
	Type          string            `json:"type"`
	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Decoders      []json.RawMessage `json:"decoders"`
	Processors    []json.RawMessage `json:"processors"`
	Prepend       string            `json:"prepend"`
	Pattern       *struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content          json.RawMessage  `json:"content"`
	Behavior         string           `json:"behavior"`
	Invert           bool             `json:"invert"`
	AddPrefixSpace   *bool            `json:"add_prefix_space"`
	UseRegex         *bool            `json:"use_regex"`
	Replacement      string           `json:"replacement"`
	PrependScheme    string           `json:"prepend_scheme"`
	Split            *bool            `json:"split"`
	IndividualDigits bool             `json:"individual_digits"`
	Start            int              `json:"start"`
	Stop             int              `json:"stop"`
	Left             bool             `json:"left"`
	Right            bool             `json:"right"`
	Single           []hfTemplateItem `json:"single"`
	SpecialTokens    map[string]struct {
		IDs []int `json:"ids"`
	} `json:"special_tokens"`
	Sep json.RawMessage `json:"sep"`
	Cls json.RawMessage `json:"cls"`
}

type hfTemplateItem struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// Load reads a tokenizer.json file, a llama2.c tokenizer.bin, or a directory
// holding tokenizer.json (plus tokenizer_config.json when present).
func Load(path string) (*Tokenizer, error) {
	t, err := load(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", path, err)
	}
	return t, nil
}

func load(path string) (*Tokenizer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.IsDir() {
		return loadFS(os.DirFS(path))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if trimmed := bytes.TrimLeft(data, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
		return parseHFJSON(data)
	}
	return parseLlama2C(data)
}

// LoadFS reads tokenizer.json (plus tokenizer_config.json, chat_template.jinja
// and generation_config.json when present) from the root of fsys, e.g. files
// embedded in the binary.
func LoadFS(fsys fs.FS, name string) (*Tokenizer, error) {
	t, err := loadFS(fsys)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", name, err)
	}
	return t, nil
}

func loadFS(fsys fs.FS) (*Tokenizer, error) {
	data, err := fs.ReadFile(fsys, "tokenizer.json")
	if err != nil {
		return nil, err
	}
	t, err := parseHFJSON(data)
	if err != nil {
		return nil, err
	}
	if err := t.applyConfig(fsys); err != nil {
		return nil, err
	}
	return t, nil
}

// ParseHFJSON builds a Tokenizer from the bytes of a tokenizer.json file.
func ParseHFJSON(data []byte) (*Tokenizer, error) {
	t, err := parseHFJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse tokenizer.json: %w", err)
	}
	return t, nil
}

func parseHFJSON(data []byte) (*Tokenizer, error) {
	var f hfFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	m := &f.Model
	if m.Type != "" && m.Type != "BPE" {
		return nil, fmt.Errorf("model type %q is not supported (only BPE)", m.Type)
	}
	if m.Type == "" && m.Vocab == nil {
		return nil, errors.New("no model in tokenizer.json")
	}
	if m.Prefix != nil && *m.Prefix != "" || m.Suffix != nil && *m.Suffix != "" {
		return nil, errors.New("BPE continuing_subword_prefix/end_of_word_suffix are not supported")
	}
	t := newTokenizer()
	t.vocab = m.Vocab
	if t.vocab == nil {
		t.vocab = map[string]int{}
	}
	maxID := -1
	for _, id := range t.vocab {
		if id < 0 || id > 1<<24 {
			return nil, fmt.Errorf("vocab id %d out of range", id)
		}
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		if a.ID < 0 || a.ID > 1<<24 {
			return nil, fmt.Errorf("added token id %d out of range", a.ID)
		}
		if a.ID > maxID {
			maxID = a.ID
		}
	}
	// Ids are dense in real files; bound the holes so that a hostile file
	// cannot make us allocate tables for millions of absent ids.
	if limit := 2*(len(t.vocab)+len(f.AddedTokens)) + 256; maxID >= limit {
		return nil, fmt.Errorf("token id %d is far beyond the %d tokens defined", maxID, len(t.vocab)+len(f.AddedTokens))
	}
	t.pieces = make([]string, maxID+1)
	for s, id := range t.vocab {
		t.pieces[id] = s
	}
	for _, a := range f.AddedTokens {
		t.pieces[a.ID] = a.Content
		t.added = append(t.added, addedToken{content: a.Content, id: a.ID, lstrip: a.LStrip, rstrip: a.RStrip, singleWord: a.SingleWord, special: a.Special})
	}
	t.finishAdded()

	// Merges: "a b" strings or [a, b] pairs; decoded as a typed slice in
	// one go, which is much faster than element by element.
	var pairs [][]string
	if !isNull(m.Merges) {
		var strs []string
		if err := json.Unmarshal(m.Merges, &strs); err == nil {
			pairs = make([][]string, len(strs))
			for i, s := range strs {
				a, b, ok := strings.Cut(s, " ")
				if !ok {
					return nil, fmt.Errorf("merge %d %q: no space", i, s)
				}
				pairs[i] = []string{a, b}
			}
		} else if err := json.Unmarshal(m.Merges, &pairs); err != nil {
			// Mixed forms: element by element.
			var raws []json.RawMessage
			if err := json.Unmarshal(m.Merges, &raws); err != nil {
				return nil, fmt.Errorf("merges: %w", err)
			}
			pairs = make([][]string, len(raws))
			for i, raw := range raws {
				var s string
				if json.Unmarshal(raw, &s) == nil {
					a, b, ok := strings.Cut(s, " ")
					if !ok {
						return nil, fmt.Errorf("merge %d %q: no space", i, s)
					}
					pairs[i] = []string{a, b}
				} else if err := json.Unmarshal(raw, &pairs[i]); err != nil {
					return nil, fmt.Errorf("merge %d: want \"a b\" or [a, b]", i)
				}
			}
		}
	}
	t.merges = make(map[uint64]mergeInfo, len(pairs))
	for rank, pair := range pairs {
		if len(pair) != 2 {
			return nil, fmt.Errorf("merge %d: want a pair of strings", rank)
		}
		a, b := pair[0], pair[1]
		ia, ok1 := t.vocab[a]
		ib, ok2 := t.vocab[b]
		im, ok3 := t.vocab[a+b]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("merge %d (%q %q) uses tokens missing from the vocabulary", rank, a, b)
		}
		t.merges[pairKey(int32(ia), int32(ib))] = mergeInfo{rank: int32(rank), id: int32(im)}
	}
	t.byteFallback = m.ByteFallback
	t.fuseUnk = m.FuseUnk
	t.ignoreMerges = m.IgnoreMerges
	if m.UnkToken != nil {
		id, ok := t.vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q not in vocabulary", *m.UnkToken)
		}
		t.unk = id
	}

	t.input = inputRunes
	if err := t.parseNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if err := t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	t.setFastSplit()
	t.initByteTables()
	if t.input == inputRunes {
		t.setChunkSep("▁")
	}
	t.finishPipeline()
	if err := t.parseDecoder(f.Decoder); err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	if err := t.parsePostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("post_processor: %w", err)
	}
	if len(t.prefix) > 0 {
		t.bos = t.prefix[0]
	}
	if len(t.suffix) > 0 {
		t.eos = []int{t.suffix[len(t.suffix)-1]}
	}
	return t, nil
}

func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

func (t *Tokenizer) parseNormalizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return err
	}
	switch n.Type {
	case "Sequence":
		for _, sub := range n.Normalizers {
			if err := t.parseNormalizer(sub); err != nil {
				return err
			}
		}
	case "Prepend":
		t.norm = append(t.norm, normStep{kind: normPrepend, a: n.Prepend})
	case "Replace":
		if n.Pattern == nil || n.Pattern.String == nil {
			return errors.New("Replace normalizer needs a String pattern")
		}
		var content string
		if err := json.Unmarshal(n.Content, &content); err != nil {
			return fmt.Errorf("Replace content: %w", err)
		}
		if *n.Pattern.String == "" {
			return errors.New("Replace normalizer with an empty pattern")
		}
		t.norm = append(t.norm, normStep{kind: normReplace, a: *n.Pattern.String, b: content})
	case "Lowercase":
		t.norm = append(t.norm, normStep{kind: normLower})
	case "Strip":
		t.norm = append(t.norm, normStep{kind: normStrip, left: n.Left, right: n.Right})
	case "NFC":
		// Identity for text already in NFC, which is nearly all input;
		// kiln carries no Unicode normalization tables.
	default:
		return fmt.Errorf("normalizer %q is not supported", n.Type)
	}
	return nil
}

func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return err
	}
	switch n.Type {
	case "Sequence":
		for _, sub := range n.Pretokenizers {
			if err := t.parsePreTokenizer(sub); err != nil {
				return err
			}
		}
	case "ByteLevel":
		t.input = inputBytes
		if n.AddPrefixSpace != nil && *n.AddPrefixSpace {
			t.pre = append(t.pre, preStep{kind: prePrefixSpace})
		}
		if n.UseRegex == nil || *n.UseRegex {
			t.pre = append(t.pre, preStep{kind: preSplit, split: gpt2Scanner{}, behavior: behIsolated})
		}
	case "Split":
		if n.Pattern == nil {
			return errors.New("Split without pattern")
		}
		var sp splitter
		switch {
		case n.Pattern.Regex != nil:
			var err error
			if sp, err = newRegexSplitter(*n.Pattern.Regex); err != nil {
				return err
			}
		case n.Pattern.String != nil:
			sp = stringSplitter{*n.Pattern.String}
		default:
			return errors.New("Split pattern is neither String nor Regex")
		}
		beh, err := parseBehavior(n.Behavior)
		if err != nil {
			return err
		}
		t.pre = append(t.pre, preStep{kind: preSplit, split: sp, behavior: beh, invert: n.Invert})
	case "Metaspace":
		rep := n.Replacement
		if rep == "" {
			rep = "▁"
		}
		st := preStep{kind: preMetaspace, replacement: rep, prepend: 1, splitWords: true}
		switch n.PrependScheme {
		case "never":
			st.prepend = 0
		case "first":
			st.prepend = 2
		case "always", "":
			if n.PrependScheme == "" && n.AddPrefixSpace != nil && !*n.AddPrefixSpace {
				st.prepend = 0
			}
		default:
			return fmt.Errorf("Metaspace prepend_scheme %q", n.PrependScheme)
		}
		if n.Split != nil {
			st.splitWords = *n.Split
		}
		t.pre = append(t.pre, st)
	case "Digits":
		t.pre = append(t.pre, preStep{kind: preDigits, individual: n.IndividualDigits})
	default:
		return fmt.Errorf("pre-tokenizer %q is not supported", n.Type)
	}
	return nil
}

func parseBehavior(s string) (splitBehavior, error) {
	switch s {
	case "Isolated", "":
		return behIsolated, nil
	case "Removed":
		return behRemoved, nil
	case "MergedWithPrevious":
		return behMergedWithPrevious, nil
	case "MergedWithNext":
		return behMergedWithNext, nil
	case "Contiguous":
		return behContiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q is not supported", s)
}

// setFastSplit recognizes the common single-split pipeline so that words
// are encoded straight from spans without building a word list.
func (t *Tokenizer) setFastSplit() {
	t.fastSplit = nil
	if len(t.pre) == 1 && t.pre[0].kind == preSplit && t.pre[0].behavior == behIsolated && !t.pre[0].invert {
		if sc, ok := t.pre[0].split.(scanner); ok {
			t.fastSplit = sc
		}
	}
}

func (t *Tokenizer) parseDecoder(raw json.RawMessage) error {
	n := len(t.pieces)
	if isNull(raw) {
		t.dec = decoderConfig{mode: decJoin}
		return nil
	}
	var nodes []hfNode
	var top hfNode
	if err := json.Unmarshal(raw, &top); err != nil {
		return err
	}
	if top.Type == "Sequence" {
		for _, sub := range top.Decoders {
			var d hfNode
			if err := json.Unmarshal(sub, &d); err != nil {
				return err
			}
			nodes = append(nodes, d)
		}
	} else {
		nodes = []hfNode{top}
	}
	for _, d := range nodes {
		if d.Type == "ByteLevel" {
			if len(nodes) != 1 {
				return errors.New("ByteLevel decoder inside a Sequence is not supported")
			}
			_, u2b := bytesToUnicode()
			t.dec = decoderConfig{mode: decBytes, raw: make([][]byte, n)}
			for id, p := range t.pieces {
				if b, ok := byteLevelDecode(u2b, p); ok {
					t.dec.raw[id] = b
				} else {
					t.dec.raw[id] = []byte(p)
				}
			}
			return nil
		}
	}
	c := decoderConfig{mode: decPieces, text: make([]string, n)}
	copy(c.text, t.pieces)
	fused := false
	for _, d := range nodes {
		switch d.Type {
		case "Replace":
			if d.Pattern == nil || d.Pattern.String == nil || *d.Pattern.String == "" {
				return errors.New("Replace decoder needs a String pattern")
			}
			var content string
			if err := json.Unmarshal(d.Content, &content); err != nil {
				return fmt.Errorf("Replace content: %w", err)
			}
			for i := range c.text {
				c.text[i] = strings.ReplaceAll(c.text[i], *d.Pattern.String, content)
			}
		case "ByteFallback":
			c.byteOf = make([]int16, n)
			for i, p := range t.pieces {
				c.byteOf[i] = -1
				if b, ok := parseByteToken(p); ok {
					c.byteOf[i] = int16(b)
				}
			}
		case "Fuse":
			fused = true
		case "Strip":
			var content string
			if err := json.Unmarshal(d.Content, &content); err != nil || len([]rune(content)) != 1 {
				return errors.New("Strip decoder content must be one character")
			}
			if d.Stop != 0 {
				return errors.New("Strip decoder with stop > 0 is not supported")
			}
			c.stripChar = []rune(content)[0]
			c.stripN = d.Start
			c.perToken = !fused
		case "Metaspace":
			rep := d.Replacement
			if rep == "" {
				rep = "▁"
			}
			for i := range c.text {
				c.text[i] = strings.ReplaceAll(c.text[i], rep, " ")
			}
			if d.PrependScheme != "never" && (d.AddPrefixSpace == nil || *d.AddPrefixSpace || d.PrependScheme != "") {
				// HF drops every replacement rune of the first token.
				c.metaFirst = rep
			}
		default:
			return fmt.Errorf("decoder %q is not supported", d.Type)
		}
	}
	t.dec = c
	return nil
}

func (t *Tokenizer) parsePostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var n hfNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return err
	}
	switch n.Type {
	case "Sequence":
		for _, sub := range n.Processors {
			if err := t.parsePostProcessor(sub); err != nil {
				return err
			}
		}
	case "ByteLevel":
	case "TemplateProcessing":
		seen := false
		for _, it := range n.Single {
			switch {
			case it.Sequence != nil:
				seen = true
			case it.SpecialToken != nil:
				st, ok := n.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return fmt.Errorf("template token %q not defined", it.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || id >= len(t.pieces) {
						return fmt.Errorf("template token id %d out of range", id)
					}
				}
				if seen {
					t.suffix = append(t.suffix, st.IDs...)
				} else {
					t.prefix = append(t.prefix, st.IDs...)
				}
			}
		}
	case "RobertaProcessing", "BertProcessing":
		cls, err := t.tokenPairID(n.Cls)
		if err != nil {
			return err
		}
		sep, err := t.tokenPairID(n.Sep)
		if err != nil {
			return err
		}
		t.prefix = append(t.prefix, cls)
		t.suffix = append(t.suffix, sep)
	default:
		return fmt.Errorf("post-processor %q is not supported", n.Type)
	}
	return nil
}

// tokenPairID reads a ["<s>", 0] pair.
func (t *Tokenizer) tokenPairID(raw json.RawMessage) (int, error) {
	var pair []any
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return 0, errors.New("want a [token, id] pair")
	}
	f, ok := pair[1].(float64)
	if !ok || f < 0 || int(f) >= len(t.pieces) {
		return 0, errors.New("bad id in [token, id] pair")
	}
	return int(f), nil
}

// hfConfig is the part of tokenizer_config.json kiln uses.
type hfConfig struct {
	BOS          json.RawMessage `json:"bos_token"`
	EOS          json.RawMessage `json:"eos_token"`
	ChatTemplate json.RawMessage `json:"chat_template"`
}

// applyConfig reads the optional companion files of a model directory.
func (t *Tokenizer) applyConfig(fsys fs.FS) error {
	if data, err := fs.ReadFile(fsys, "tokenizer_config.json"); err == nil {
		var c hfConfig
		if err := json.Unmarshal(data, &c); err != nil {
			return fmt.Errorf("tokenizer_config.json: %w", err)
		}
		if s := tokenString(c.BOS); s != "" {
			if id, ok := t.TokenID(s); ok {
				t.bos = id
			}
		}
		if s := tokenString(c.EOS); s != "" {
			if id, ok := t.TokenID(s); ok {
				t.eos = []int{id}
			}
		}
		t.chatTemplate = templateString(c.ChatTemplate)
	}
	if t.chatTemplate == "" {
		if data, err := fs.ReadFile(fsys, "chat_template.jinja"); err == nil {
			t.chatTemplate = string(data)
		}
	}
	if data, err := fs.ReadFile(fsys, "generation_config.json"); err == nil {
		var g struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if json.Unmarshal(data, &g) == nil {
			var one int
			var many []int
			if json.Unmarshal(g.EOS, &one) == nil {
				many = []int{one}
			} else {
				_ = json.Unmarshal(g.EOS, &many)
			}
			for _, id := range many {
				if id >= 0 && id < len(t.pieces) && !slices.Contains(t.eos, id) {
					t.eos = append(t.eos, id)
				}
			}
		}
	}
	return nil
}

// tokenString reads a token given as "text" or {"content": "text"}.
func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

// templateString reads chat_template as a string or as a list of named
// templates, preferring "default".
func templateString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var l []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(raw, &l) != nil || len(l) == 0 {
		return ""
	}
	sort.SliceStable(l, func(i, j int) bool { return l[i].Name == "default" && l[j].Name != "default" })
	return l[0].Template
}
