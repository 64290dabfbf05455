package check

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// modulePath is the repository's module path prefix: an import under it is a directory of the
// repository, whose source the variable reader follows.
const modulePath = "github.com/integrations-platform/integrations/"

// Services are the platform's six services, each with services/<name>/internal/config.Config.
var Services = []string{"gateway", "dispatcher", "execution-consumer", "adapter-callback", "settlement", "event-router"}

// Var is one environment variable a service's configuration reads.
type Var struct {
	Name  string
	Field string // where it is declared: pkg.Type.Field, for the messages
}

// ConfigVars reads the variables services/<service>/internal/config.Config reads, from its
// `env:"..."` struct tags, following embedded and named struct fields into the repository's
// other packages (pkg/config, sdk/go/platformtoken, ...). The config packages are internal to the
// services' modules, so the source is parsed, not imported; reading it keeps the check in step
// with the code, where a list kept by hand would drift.
func ConfigVars(root, service string) ([]Var, error) {
	r := &varReader{root: root, pkgs: map[string]*parsedPkg{}}
	dir := filepath.Join(root, "services", service, "internal", "config")
	var vars []Var
	if err := r.walkType(dir, "Config", "", &vars, nil); err != nil {
		return nil, fmt.Errorf("variables of %s: %w", service, err)
	}
	sort.Slice(vars, func(i, j int) bool { return vars[i].Name < vars[j].Name })
	return vars, nil
}

type parsedPkg struct {
	name  string
	types map[string]*ast.StructType
	// A struct field's selector (config.Common) resolves with the imports of the file that
	// declares the struct.
	fileOf  map[string]*ast.File
	imports map[*ast.File][]importSpec
}

type importSpec struct {
	name string // "" when the import does not rename the package
	path string
}

type varReader struct {
	root string
	pkgs map[string]*parsedPkg
}

func (r *varReader) pkg(dir string) (*parsedPkg, error) {
	if p, ok := r.pkgs[dir]; ok {
		return p, nil
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read package %s: %w", dir, err)
	}
	p := &parsedPkg{types: map[string]*ast.StructType{}, fileOf: map[string]*ast.File{}, imports: map[*ast.File][]importSpec{}}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", filepath.Join(dir, n), err)
		}
		p.name = f.Name.Name
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			spec := importSpec{path: path}
			if im.Name != nil {
				spec.name = im.Name.Name
			}
			p.imports[f] = append(p.imports[f], spec)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, s := range gd.Specs {
				ts := s.(*ast.TypeSpec)
				if st, ok := ts.Type.(*ast.StructType); ok {
					p.types[ts.Name.Name] = st
					p.fileOf[ts.Name.Name] = f
				}
			}
		}
	}
	r.pkgs[dir] = p
	return p, nil
}

// walkType collects the variables of struct type name in the package at dir, with prefix (an
// envPrefix tag on an enclosing field) before each name. seen guards against recursive types.
func (r *varReader) walkType(dir, name, prefix string, vars *[]Var, seen map[string]bool) error {
	key := dir + "." + name
	if seen[key] {
		return nil
	}
	seen = mapWith(seen, key)
	p, err := r.pkg(dir)
	if err != nil {
		return err
	}
	st, ok := p.types[name]
	if !ok {
		return fmt.Errorf("no struct type %s in %s", name, dir)
	}
	f := p.fileOf[name]
	for _, field := range st.Fields.List {
		tag := reflect.StructTag("")
		if field.Tag != nil {
			s, _ := strconv.Unquote(field.Tag.Value)
			tag = reflect.StructTag(s)
		}
		env, hasEnv := tag.Lookup("env")
		// caarlos0/env skips what it cannot set (unexported fields, embedded unexported types)
		// and fields tagged env:"-".
		if !settable(field) || env == "-" {
			continue
		}
		if hasEnv {
			n := strings.Split(env, ",")[0]
			if n != "" {
				fieldName := name
				if len(field.Names) > 0 {
					fieldName += "." + field.Names[0].Name
				}
				*vars = append(*vars, Var{Name: prefix + n, Field: p.name + "." + fieldName})
				continue
			}
		}
		// caarlos0/env descends into every struct field without an env name, embedded or not.
		// Kinds whose rules this reader does not mirror (a pointer to a struct, read only when
		// set or `init`; an inline struct; a slice of structs, read with indexed prefixes; a
		// generic type) are refused rather than guessed at.
		isStruct := func(e ast.Expr) bool {
			_, _, ok, _ := r.resolve(dir, p, f, e)
			return ok
		}
		if err := unsupported(field.Type, isStruct); err != nil {
			return fmt.Errorf("%s.%s: field %s: %w", p.name, name, fieldLabel(field), err)
		}
		subDir, subType, ok, err := r.resolve(dir, p, f, field.Type)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", p.name, name, err)
		}
		if !ok {
			continue
		}
		if err := r.walkType(subDir, subType, prefix+tag.Get("envPrefix"), vars, seen); err != nil {
			return err
		}
	}
	return nil
}

// resolve finds the package directory and type name of a field's type when it is a struct type
// of the repository (same package, or an import under modulePath); other types are leaves. A
// repository package that cannot be parsed is an error: skipping it would hide its variables.
func (r *varReader) resolve(dir string, p *parsedPkg, f *ast.File, t ast.Expr) (string, string, bool, error) {
	switch t := t.(type) {
	case *ast.StarExpr:
		return r.resolve(dir, p, f, t.X)
	case *ast.Ident:
		if _, ok := p.types[t.Name]; ok {
			return dir, t.Name, true, nil
		}
	case *ast.SelectorExpr:
		x, ok := t.X.(*ast.Ident)
		if !ok {
			return "", "", false, nil
		}
		for _, im := range p.imports[f] {
			if !strings.HasPrefix(im.path, modulePath) || im.name != "" && im.name != x.Name {
				continue
			}
			sub := filepath.Join(r.root, filepath.FromSlash(strings.TrimPrefix(im.path, modulePath)))
			sp, err := r.pkg(sub)
			if err != nil {
				return "", "", false, err
			}
			// An unrenamed import is known by the package's own name, not its directory's.
			if im.name == "" && sp.name != x.Name {
				continue
			}
			if _, ok := sp.types[t.Sel.Name]; ok {
				return sub, t.Sel.Name, true, nil
			}
			return "", "", false, nil
		}
	}
	return "", "", false, nil
}

// settable reports whether caarlos0/env can set field: an exported name, or an embedded exported
// type.
func settable(field *ast.Field) bool {
	if len(field.Names) > 0 {
		return ast.IsExported(field.Names[0].Name)
	}
	t := field.Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch t := t.(type) {
	case *ast.Ident:
		return ast.IsExported(t.Name)
	case *ast.SelectorExpr:
		return ast.IsExported(t.Sel.Name)
	}
	return true
}

// unsupported names a field type the reader does not follow as caarlos0/env would; isStruct
// reports whether a type expression is a struct type of the repository.
func unsupported(t ast.Expr, isStruct func(ast.Expr) bool) error {
	switch t := t.(type) {
	case *ast.StarExpr:
		if isStruct(t.X) {
			return fmt.Errorf("a pointer to a struct (env reads its fields only when it is set or tagged init): use a value")
		}
	case *ast.StructType:
		return fmt.Errorf("an inline struct type: declare it as a named type")
	case *ast.ArrayType:
		if isStruct(t.Elt) {
			return fmt.Errorf("a slice of structs (env reads them with indexed prefixes)")
		}
	case *ast.IndexExpr, *ast.IndexListExpr:
		return fmt.Errorf("a generic type")
	}
	return nil
}

func fieldLabel(field *ast.Field) string {
	if len(field.Names) > 0 {
		return field.Names[0].Name
	}
	return "(embedded)"
}

func mapWith(m map[string]bool, k string) map[string]bool {
	n := make(map[string]bool, len(m)+1)
	for key := range m {
		n[key] = true
	}
	n[k] = true
	return n
}
