package tokenizer

import (
	"os"
	"testing"

	"kiln/internal/testshared"
)

var benchTokenizers = []struct {
	name string
	path []string
}{
	{"gpt2", []string{"tokenizers", "gpt2", "tokenizer.json"}},
	{"llama3.2", []string{"tokenizers", "llama3.2-bpe", "tokenizer.json"}},
	{"phi-3-mini", []string{"tokenizers", "phi-3-mini", "tokenizer.json"}},
	{"llama2c-32k", []string{"models", "llama2c-tokenizer-32k", "tokenizer.bin"}},
}

// BenchmarkEncode encodes War and Peace (3.2 MB) line by line, the way
// prompts arrive, with a fresh tokenizer cache per run.
func BenchmarkEncode(b *testing.B) {
	data, err := os.ReadFile(testshared.Path(b, "corpora", "war-and-peace.txt"))
	if err != nil {
		b.Fatal(err)
	}
	text := string(data)
	for _, bt := range benchTokenizers {
		b.Run(bt.name, func(b *testing.B) {
			tk, err := Load(testshared.Path(b, bt.path...))
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			cpu0 := cpuSeconds()
			n := 0
			for range b.N {
				n = len(tk.Encode(text, false))
			}
			// CPU-time throughput too: wall-clock MB/s is unreliable on a
			// shared, loaded machine.
			if cpu := cpuSeconds() - cpu0; cpu > 0 {
				b.ReportMetric(float64(len(text))*float64(b.N)/cpu/1e6, "cpuMB/s")
			}
			b.ReportMetric(float64(n), "tokens")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	data, err := os.ReadFile(testshared.Path(b, "corpora", "war-and-peace.txt"))
	if err != nil {
		b.Fatal(err)
	}
	tk := loadShared(b, "tokenizers", "llama3.2-bpe", "tokenizer.json")
	ids := tk.Encode(string(data), false)
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for range b.N {
		_ = tk.Decode(ids)
	}
}
