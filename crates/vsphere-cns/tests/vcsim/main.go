// A vCenter simulator with CNS endpoints, built from Debian's golang-github-vmware-govmomi-dev
// (GOPATH mode). It prints its URL on the first line of stdout and serves until stdin closes.
package main

import (
	"fmt"
	"io"
	"net/url"
	"os"

	_ "github.com/vmware/govmomi/cns/simulator"
	"github.com/vmware/govmomi/simulator"
)

func main() {
	model := simulator.VPX()
	if err := model.Create(); err != nil {
		fmt.Fprintln(os.Stderr, "model:", err)
		os.Exit(1)
	}
	model.Service.RegisterEndpoints = true
	model.Service.Listen = &url.URL{Host: "127.0.0.1:0", User: url.UserPassword("cnsuser", "cnspass")}
	server := model.Service.NewServer()
	fmt.Println(server.URL.Scheme + "://" + server.URL.Host)
	_, _ = io.Copy(io.Discard, os.Stdin)
	server.Close()
	model.Remove()
}
