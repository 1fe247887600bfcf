// dattn: the command-line client of the dattn coordinator. See docs/CLI.md.
#include <iostream>

#include "client/cli.h"

int main(int argc, char** argv) { return dattn::client::RunCli(argc, argv, std::cout, std::cerr); }
