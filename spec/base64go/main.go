// The reference the base64 unit test compares gkm's decoder with: Go's own
// encoding/base64 (what cosign and containers/image decode signatures with)
// and protobuf's JSON mapping of a bytes field (what sigstore-go and cosign
// v3 read bundles with), built offline from Debian's packages in GOPATH mode.
//
// Input: one case per line, the bytes to decode in hex ("-" for none).
// Output: one line per case, "<std> <protojson>", each "ok:<hex>" ("ok:-"
// when empty) or "err"; std errors carry Go's offset ("err:<n>").
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func show(b []byte) string {
	if len(b) == 0 {
		return "ok:-"
	}
	return "ok:" + hex.EncodeToString(b)
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var src []byte
		if line := in.Text(); line != "-" {
			var err error
			if src, err = hex.DecodeString(line); err != nil {
				fmt.Fprintln(os.Stderr, "bad hex:", err)
				os.Exit(2)
			}
		}
		std := "err"
		if b, err := base64.StdEncoding.DecodeString(string(src)); err == nil {
			std = show(b)
		} else if c, ok := err.(base64.CorruptInputError); ok {
			std = fmt.Sprintf("err:%d", int64(c))
		}
		// a JSON string holding exactly these bytes, as a bundle field would
		quoted, err := json.Marshal(string(src))
		if err != nil {
			fmt.Fprintln(os.Stderr, "quote:", err)
			os.Exit(2)
		}
		pj := "err"
		var v wrapperspb.BytesValue
		if protojson.Unmarshal(quoted, &v) == nil {
			pj = show(v.Value)
		}
		fmt.Fprintln(out, std, pj)
	}
}
