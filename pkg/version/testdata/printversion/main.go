// Command printversion prints version.String(), for TestLinkerSymbol.
package main

import (
	"fmt"

	"github.com/integrations-platform/integrations/pkg/version"
)

func main() { fmt.Println(version.String()) }
