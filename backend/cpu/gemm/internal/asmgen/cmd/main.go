// Command cmd writes the generated gemm assembly to the file named by -o.
package main

import (
	"flag"
	"log"
	"os"

	"kiln/backend/cpu/gemm/internal/asmgen"
)

func main() {
	out := flag.String("o", "gemm_amd64.s", "output file")
	flag.Parse()
	if err := os.WriteFile(*out, asmgen.Generate(), 0o644); err != nil {
		log.Fatal(err)
	}
}
