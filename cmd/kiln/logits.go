package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
)

func cmdLogits(args []string) error {
	fs := flag.NewFlagSet("logits", flag.ContinueOnError)
	var ef engineFlags
	ef.register(fs)
	idsFlag := fs.String("ids", "", "input token ids, e.g. 1,2,3")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return fmt.Errorf("want at most one MODEL argument, got %d", len(pos))
	}
	ids, err := parseIDs(*idsFlag)
	if err != nil {
		return err
	}
	m, err := openModel(modelPath(pos))
	if err != nil {
		return err
	}
	defer m.Close()
	e, err := newEngine(m, &ef)
	if err != nil {
		return err
	}
	defer e.Close()
	seq := e.NewSequence()
	logits, err := e.Prefill(seq, ids, true)
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	v := e.Vocab()
	out.WriteString(`{"logits": [`)
	buf := make([]byte, 0, 32)
	for r := 0; r < len(ids); r++ {
		if r > 0 {
			out.WriteString(", ")
		}
		out.WriteByte('[')
		for i, x := range logits[r*v : (r+1)*v] {
			if i > 0 {
				out.WriteString(", ")
			}
			out.Write(strconv.AppendFloat(buf[:0], float64(x), 'g', -1, 32))
		}
		out.WriteByte(']')
	}
	out.WriteString("]}\n")
	return nil
}
